// The JavaScript side of `melddb-bench js`: prints one JSON object.
//
//   node bench/bench.mjs --keys N --secs S --log FILE --rounds R
//
// - 8r2w transactions per second through the package's API (one node on
//   an in-memory log, N keys of 8 bytes with 100-byte values loaded);
// - meld of a recorded log (u32 little-endian length + bytes per entry,
//   the genesis record first): a new node follows it from position 0,
//   best of R rounds;
// - the .wasm size raw, gzip and brotli.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { brotliCompressSync, constants, gzipSync } from "node:zlib";
import { MeldDB, MemoryLog } from "melddb";

const args = new Map();
for (let i = 2; i < process.argv.length; i += 2) args.set(process.argv[i], process.argv[i + 1]);
const keys = Number(args.get("--keys") ?? 200000);
const secs = Number(args.get("--secs") ?? 3);
const rounds = Number(args.get("--rounds") ?? 3);
const logFile = args.get("--log");

function key(i) {
  const k = new Uint8Array(8);
  new DataView(k.buffer).setBigUint64(0, BigInt(i));
  return k;
}
const value = new Uint8Array(100).fill(7);

async function txns() {
  const db = await MeldDB.memory();
  for (let i = 0; i < keys; i += 10000) {
    await db.transact((tx) => {
      for (let j = i; j < Math.min(i + 10000, keys); j++) tx.put(key(j), value);
    });
  }
  let s = 12345;
  const rnd = () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) % keys;
  };
  const fresh = new Uint8Array(100);
  let n = 0;
  const start = performance.now();
  const end = start + secs * 1000;
  while (performance.now() < end) {
    for (let b = 0; b < 64; b++) {
      await db.transact((tx) => {
        for (let r = 0; r < 8; r++) tx.get(key(rnd()));
        fresh[0] = n & 0xff;
        fresh[1] = (n >> 8) & 0xff;
        tx.put(key(rnd()), fresh);
        tx.put(key(rnd()), fresh);
      });
      n++;
    }
  }
  const elapsed = (performance.now() - start) / 1000;
  db.close();
  return n / elapsed;
}

async function meld() {
  const bytes = readFileSync(logFile);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const log = new MemoryLog();
  for (let at = 0; at < bytes.length; ) {
    const len = view.getUint32(at, true);
    log.appendNow(bytes.subarray(at + 4, at + 4 + len));
    at += 4 + len;
  }
  let best = Infinity;
  for (let r = 0; r < rounds; r++) {
    const start = performance.now();
    const db = await MeldDB.follow(log);
    best = Math.min(best, (performance.now() - start) / 1000);
    if (db.nextPos !== log.length) throw new Error(`melded to ${db.nextPos} of ${log.length}`);
    db.close();
  }
  return { entries: log.length - 1, best_seconds: best };
}

const wasm = readFileSync(join(dirname(fileURLToPath(import.meta.url)), "..", "pkg", "melddb_wasm_bg.wasm"));
const out = {
  txn_tps_8r2w: await txns(),
  meld: logFile === undefined ? null : await meld(),
  wasm_raw_bytes: wasm.length,
  wasm_gzip_bytes: gzipSync(wasm, { level: 9 }).length,
  wasm_brotli_bytes: brotliCompressSync(wasm, { params: { [constants.BROTLI_PARAM_QUALITY]: 11 } }).length,
};
console.log(JSON.stringify(out));
