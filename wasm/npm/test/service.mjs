// A real log service for the tests: the workspace's melddb-log binary on
// loopback over a temporary directory, stopped by the test that started it.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const workspace = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const targetDir = process.env.CARGO_TARGET_DIR ?? join(workspace, "target");

/** Builds (incrementally) and returns the path of a release binary of the workspace. */
export function binary(pkg, name) {
  execFileSync("cargo", ["build", "--release", "--quiet", "-p", pkg], { cwd: workspace, stdio: ["ignore", "inherit", "inherit"] });
  return join(targetDir, "release", name);
}

/**
 * Starts a service; `t.after` stops it. Tokens: `writer` (read and append
 * on every log) and `reader` (read only). `restart()` stops it and starts it
 * again on the same ports and zones.
 */
export async function startService(t) {
  const bin = binary("melddb-log", "melddb-log");
  const dir = mkdtempSync(join(tmpdir(), "melddb-js-service-"));
  let child;
  let addrs;
  const config = (tcp, http) => `zones = ["${dir}/z0", "${dir}/z1", "${dir}/z2"]
data_shards = 2
parity_shards = 1
page_bytes = 4096
segment_bytes = 4194304
prepared_segments = 0
max_record_bytes = 1048576

[limits]
max_frame_bytes = 2097152

[listen]
tcp = "${tcp}"
http = "${http}"

[tokens.writer]
logs = ["*"]
read = true
append = true

[tokens.reader]
logs = ["*"]
read = true
append = false
`;
  const start = (tcp, http) =>
    new Promise((resolve, reject) => {
      writeFileSync(join(dir, "log.toml"), config(tcp, http));
      child = spawn(bin, ["serve", "--config", join(dir, "log.toml")], { stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      let err = "";
      child.stderr.on("data", (d) => (err += d));
      child.stdout.on("data", (d) => {
        out += d;
        const line = out.split("\n").find((l) => l.startsWith("{"));
        if (line !== undefined) resolve(JSON.parse(line));
      });
      child.on("exit", (code) => reject(new Error(`melddb-log exited with ${code}: ${err}`)));
    });
  const stop = () =>
    new Promise((resolve) => {
      if (child === undefined || child.exitCode !== null) return resolve();
      child.removeAllListeners("exit");
      child.on("exit", () => resolve());
      child.kill("SIGTERM");
    });
  addrs = await start("127.0.0.1:0", "127.0.0.1:0");
  t.after(async () => {
    await stop();
    rmSync(dir, { recursive: true, force: true });
  });
  return {
    get ws() {
      return `ws://${addrs.http}`;
    },
    get tcp() {
      return addrs.tcp;
    },
    async restart() {
      await stop();
      addrs = await start(addrs.tcp, addrs.http);
    },
    stop,
  };
}
