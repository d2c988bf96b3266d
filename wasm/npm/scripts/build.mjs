// Builds the package: the core for wasm32 (cargo), its JavaScript glue
// (wasm-bindgen, the CLI of the exact version the crate pins, installed
// here if missing), wasm-opt -Oz (binaryen from npm), then the TypeScript
// (tsc). Prints the .wasm size raw, gzip and brotli.
//
//   node scripts/build.mjs [--debug] [--no-opt] [--json FILE]
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { brotliCompressSync, gzipSync, constants } from "node:zlib";

const here = dirname(fileURLToPath(import.meta.url));
const pkgDir = join(here, "..");
const workspace = join(pkgDir, "..", "..");
const args = process.argv.slice(2);
const debug = args.includes("--debug");
const opt = !args.includes("--no-opt");
const jsonAt = args.indexOf("--json");

function run(cmd, argv, opts = {}) {
  const r = spawnSync(cmd, argv, { stdio: "inherit", ...opts });
  if (r.error) throw new Error(`${cmd}: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`${cmd} ${argv.join(" ")} exited with ${r.status}`);
}

function step(what) {
  console.log(`melddb build: ${what}`);
}

// The wasm-bindgen CLI must match the crate's exact pin, or the glue and
// the module disagree.
const cargoToml = readFileSync(join(workspace, "wasm", "melddb-wasm", "Cargo.toml"), "utf8");
const pin = /wasm-bindgen = "=([0-9.]+)"/.exec(cargoToml)?.[1];
if (pin === undefined) throw new Error("wasm/melddb-wasm/Cargo.toml does not pin wasm-bindgen exactly");
const cli = (() => {
  try {
    return execFileSync("wasm-bindgen", ["--version"], { encoding: "utf8" }).trim().split(" ")[1];
  } catch {
    return undefined;
  }
})();
if (cli !== pin) {
  step(`installing wasm-bindgen-cli ${pin} (found ${cli ?? "none"}; about 10 min)`);
  // No --locked: one pinned dependency of the CLI's lockfile is not in the registry.
  run("cargo", ["install", "wasm-bindgen-cli", "--version", pin]);
}

const installed = execFileSync("rustup", ["target", "list", "--installed"], { encoding: "utf8" });
if (!installed.split("\n").includes("wasm32-unknown-unknown")) {
  run("rustup", ["target", "add", "wasm32-unknown-unknown"]);
}

step(`cargo build (${debug ? "debug" : "release"})`);
const profile = debug ? [] : ["--release"];
run("cargo", ["build", "-p", "melddb-wasm", "--target", "wasm32-unknown-unknown", ...profile], { cwd: workspace });
const targetDir = process.env.CARGO_TARGET_DIR ?? join(workspace, "target");
const built = join(targetDir, "wasm32-unknown-unknown", debug ? "debug" : "release", "melddb_wasm.wasm");

step("wasm-bindgen");
const out = join(pkgDir, "pkg");
mkdirSync(out, { recursive: true });
run("wasm-bindgen", ["--target", "web", "--out-dir", out, "--out-name", "melddb_wasm", built]);

const wasm = join(out, "melddb_wasm_bg.wasm");
if (opt && !debug) {
  step("wasm-opt -Oz");
  // binaryen from npm; the features are the ones rustc enables for wasm32
  // by default, so wasm-opt keeps what the module already uses.
  const features = ["bulk-memory", "mutable-globals", "nontrapping-float-to-int", "sign-ext", "reference-types", "multivalue"];
  const bin = join(pkgDir, "node_modules", ".bin", "wasm-opt");
  if (!existsSync(bin)) throw new Error("wasm-opt missing: run npm ci in wasm/npm first");
  run(bin, ["-Oz", ...features.map((f) => `--enable-${f}`), wasm, "-o", wasm]);
}

step("tsc");
run(join(pkgDir, "node_modules", ".bin", "tsc"), ["-p", pkgDir]);

const bytes = readFileSync(wasm);
const sizes = {
  wasm_raw_bytes: bytes.length,
  wasm_gzip_bytes: gzipSync(bytes, { level: 9 }).length,
  wasm_brotli_bytes: brotliCompressSync(bytes, { params: { [constants.BROTLI_PARAM_QUALITY]: 11 } }).length,
};
console.log(`melddb build: ${wasm}: ${sizes.wasm_raw_bytes} bytes, gzip ${sizes.wasm_gzip_bytes}, brotli ${sizes.wasm_brotli_bytes}`);
if (jsonAt >= 0) {
  const file = args[jsonAt + 1];
  if (file === undefined) throw new Error("--json needs a file");
  writeFileSync(file, JSON.stringify(sizes, null, 2) + "\n");
}
