/**
 * The one wasm instance of this JavaScript realm, loaded on first use by
 * the platform's entry point (`node.ts` reads the file, `browser.ts`
 * fetches it next to the module).
 */
import init from "../pkg/melddb_wasm.js";

/** Where the platform finds the `.wasm` bytes. */
export type WasmSource = () => Promise<BufferSource | URL | Response>;

let source: WasmSource | undefined;
let loading: Promise<void> | undefined;

/** Sets how the module's bytes are found (each entry point calls it once). */
export function setWasmSource(s: WasmSource): void {
  source = s;
}

/** Loads the instance once; later calls share the first load. */
export function loadWasm(): Promise<void> {
  if (loading === undefined) {
    const s = source;
    if (s === undefined) {
      return Promise.reject(new Error("melddb: no wasm source set; import 'melddb', not its internal modules"));
    }
    loading = s().then(async (bytes) => {
      await init({ module_or_path: bytes });
    });
    // A failed load may be retried (e.g. after a network error).
    loading.catch(() => {
      loading = undefined;
    });
  }
  return loading;
}
