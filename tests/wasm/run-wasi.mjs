// Runs a wasm32-wasip1 command under Node's WASI with one directory
// preopened: node run-wasi.mjs MODULE.wasm DIR [ARGS...]; DIR is visible to
// the module as /data.
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import { argv, exit } from 'node:process';

const [, , module, dir, ...args] = argv;
if (!module || !dir) {
  console.error('usage: node run-wasi.mjs MODULE.wasm DIR [ARGS...]');
  exit(2);
}
const wasi = new WASI({
  version: 'preview1',
  args: ['melddb-replay', ...args],
  env: {},
  preopens: { '/data': dir },
  returnOnExit: true,
});
const wasm = await WebAssembly.compile(await readFile(module));
const instance = await WebAssembly.instantiate(wasm, wasi.getImportObject());
exit(wasi.start(instance));
