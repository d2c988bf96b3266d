// The packed tarball, installed into a fresh project: the README's
// examples run against it, and a TypeScript consumer type-checks.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startService } from "./service.mjs";

const pkgDir = join(dirname(fileURLToPath(import.meta.url)), "..");

function sh(cmd, args, cwd, env = process.env) {
  return execFileSync(cmd, args, { cwd, env, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

test("npm pack installs into a fresh project, where the README examples run and the types check", async (t) => {
  // The README's service example connects to MELDDB_URL.
  const svc = await startService(t);
  const env = { ...process.env, MELDDB_URL: svc.ws, MELDDB_TOKEN: "writer" };
  assert.ok(existsSync(join(pkgDir, "pkg", "melddb_wasm_bg.wasm")), "build first: npm run build");
  const work = mkdtempSync(join(tmpdir(), "melddb-pack-"));
  t.after(() => rmSync(work, { recursive: true, force: true }));
  const packed = JSON.parse(sh("npm", ["pack", "--json", "--pack-destination", work], pkgDir));
  const files = packed[0].files.map((f) => f.path).sort();
  assert.ok(files.includes("pkg/melddb_wasm_bg.wasm"), files.join(", "));
  assert.ok(files.includes("dist/node.js") && files.includes("dist/browser.js") && files.includes("dist/api.d.ts"));
  assert.ok(!files.some((f) => f.startsWith("src/") || f.startsWith("test/")), "sources are not shipped");

  const app = join(work, "app");
  sh("mkdir", ["-p", app]);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  sh("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", join(work, packed[0].filename)], app);

  const readme = readFileSync(join(pkgDir, "README.md"), "utf8");
  const blocks = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
  assert.ok(blocks.length >= 5, `README has ${blocks.length} js examples`);
  blocks.forEach((code, i) => {
    const file = join(app, `readme-${i}.mjs`);
    writeFileSync(file, code);
    sh(process.execPath, [file], app, env);
  });
  assert.match(sh(process.execPath, [join(app, "readme-0.mjs")], app), /^100\n$/);

  // A TypeScript consumer resolves the types through the exports map.
  writeFileSync(
    join(app, "consumer.ts"),
    `import { MeldDB, MeldAbortError, type Outcome, type RangeOptions } from "melddb";
const db: MeldDB = await MeldDB.memory();
const r = await db.transact((tx) => { tx.put("k", "v"); return 1; }, { isolation: "serializable", retries: 2 });
const n: number = r.value + r.pos;
const o: Outcome = await db.begin().commit();
if (!o.committed) { const reason: string = o.reason; void reason; }
const opts: RangeOptions = { prefix: "k", reverse: true, limit: 1 };
for await (const [k, v] of db.snapshot().range(opts)) { const b: Uint8Array = k; void b; void v; }
const e: Error = new MeldAbortError("m", "WriteWrite", undefined, 1);
void n; void e;
`,
  );
  writeFileSync(
    join(app, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, noEmit: true, types: [], lib: ["ES2022", "DOM", "esnext.disposable"] },
      files: ["consumer.ts"],
    }),
  );
  sh(join(pkgDir, "node_modules", ".bin", "tsc"), ["-p", app], app);
  assert.ok(readdirSync(join(app, "node_modules", "melddb", "pkg")).includes("melddb_wasm.js"));
});
