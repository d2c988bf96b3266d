/**
 * The entry point for browsers and bundlers: the `.wasm` file is fetched
 * from next to this module (bundlers rewrite the `new URL` to the asset).
 */
import { setWasmSource } from "./wasm.js";

setWasmSource(() => Promise.resolve(new URL("../pkg/melddb_wasm_bg.wasm", import.meta.url)));

export * from "./api.js";
