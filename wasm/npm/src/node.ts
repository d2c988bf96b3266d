/** The Node.js entry point: the `.wasm` file is read from the package. */
import { readFile } from "node:fs/promises";
import { setWasmSource } from "./wasm.js";

setWasmSource(() => readFile(new URL("../pkg/melddb_wasm_bg.wasm", import.meta.url)));

export * from "./api.js";
