//! Errors as JavaScript `Error` objects with a `name` and a `code`, which
//! the TypeScript layer turns into its `Error` subclasses.

use wasm_bindgen::JsValue;

/// An `Error` named `name` (one of the package's error classes) with a
/// machine-readable `code`, in the shape `src/errors.ts` expects.
pub(crate) fn js_error(name: &str, code: &str, message: impl std::fmt::Display) -> JsValue {
    let e = js_sys::Error::new(&message.to_string());
    e.set_name(name);
    // Setting a property on a fresh Error cannot fail.
    let _ = js_sys::Reflect::set(&e, &"code".into(), &code.into());
    e.into()
}

/// A transaction operation's error: limits are the caller's
/// (`MeldArgumentError`), a node that cannot be read back is storage.
pub(crate) fn txn_error(e: melddb::TxnError) -> JsValue {
    use melddb::TxnError;
    match e {
        TxnError::KeyTooLong { .. } => js_error("MeldArgumentError", "KeyTooLong", e),
        TxnError::ValueTooLarge { .. } => js_error("MeldArgumentError", "ValueTooLarge", e),
        TxnError::TooLarge { .. } => js_error("MeldArgumentError", "TooLarge", e),
        TxnError::Store(s) => store_error(s),
    }
}

/// A node of a state could not be read back.
pub(crate) fn store_error(e: melddb::StoreError) -> JsValue {
    js_error("MeldStorageError", "Store", e)
}

/// A transaction used after it was finished.
pub(crate) fn finished() -> JsValue {
    js_error(
        "MeldStateError",
        "Finished",
        "the transaction is finished; begin a new one",
    )
}
