// Runs a wasm32-wasip1 command under Node's WASI with one directory
// preopened: node --single-threaded run-wasi.mjs MODULE.wasm DIR [ARGS...];
// DIR is visible to the module as /data.
//
// Run node with --single-threaded: Node 20 here segfaults at random
// (about one run in three) after long wasm runs when V8's background
// threads are on; with them off it has not crashed once.
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
