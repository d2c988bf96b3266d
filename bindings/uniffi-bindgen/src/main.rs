//! `uniffi-bindgen`: generates the Swift and Kotlin layers of `melddb-ffi`
//! from the built library (library mode), with the UniFFI version the
//! library's scaffolding was compiled with. Run by `bindings/generate.sh`.

fn main() {
    uniffi::uniffi_bindgen_main()
}
