/**
 * The entry point for browsers and bundlers: the `.wasm` file is fetched
 * from next to this module (bundlers rewrite the `new URL` to the asset).
 */
import { setWebSocket, type WebSocketConstructor } from "./remote.js";
import { setWasmSource } from "./wasm.js";

setWasmSource(() => Promise.resolve(new URL("../pkg/melddb_wasm_bg.wasm", import.meta.url)));
setWebSocket((globalThis as { WebSocket?: WebSocketConstructor }).WebSocket);

export * from "./api.js";
