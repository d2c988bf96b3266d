/** The Node.js entry point: the `.wasm` file is read from the package. */
import { readFile } from "node:fs/promises";
import { WebSocket as NodeWebSocket } from "ws";
import { setWebSocket, type WebSocketConstructor } from "./remote.js";
import { setWasmSource } from "./wasm.js";

setWasmSource(() => readFile(new URL("../pkg/melddb_wasm_bg.wasm", import.meta.url)));
// Node 22 has a global WebSocket; Node 20 takes the `ws` package's.
setWebSocket((globalThis as { WebSocket?: WebSocketConstructor }).WebSocket ?? (NodeWebSocket as unknown as WebSocketConstructor));

export * from "./api.js";
