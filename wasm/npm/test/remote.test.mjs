// The package on a real log service over WebSocket: JavaScript nodes and a
// native node on one log agree; appends ride out a service restart and a
// lost answer (resent with the same request ids, applied once); refusals
// are typed errors.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { WebSocket } from "ws";
import { MeldDB, ServiceLog, MeldConnectionError, MeldArgumentError } from "melddb";
import { binary, startService } from "./service.mjs";

const opts = (log) => ({ log, token: "writer" });

test("JavaScript nodes and a native node on one service log reach the same state", async (t) => {
  const svc = await startService(t);
  const a = await MeldDB.connect(svc.ws, opts("shared"));
  const b = await MeldDB.connect(svc.ws, opts("shared"));
  t.after(() => {
    a.close();
    b.close();
  });
  for (let i = 0; i < 40; i++) {
    await (i % 2 ? a : b).transact((tx) => {
      const n = Number(tx.getString("counter") ?? "0");
      tx.put("counter", String(n + 1));
      tx.put(`item/${i}`, `by ${i % 2 ? "a" : "b"}`);
    });
  }
  assert.equal((await a.latest()).getString("counter"), "40");

  // A native node writes and then reports its state.
  const melddb = binary("melddb-cli", "melddb");
  const dir = mkdtempSync(join(tmpdir(), "melddb-native-node-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const native = (...args) =>
    execFileSync(melddb, ["--dir", dir, "--log", `melddb://${svc.tcp}/shared`, "--token", "writer", ...args], { encoding: "utf8" });
  native("put", "from-native", "hello");
  const stats = JSON.parse(native("stats", "--json"));
  const snap = await b.latest();
  assert.equal(snap.getString("from-native"), "hello");
  assert.equal(snap.pos, stats.last_position);
  assert.equal(snap.digest(), stats.digest);
  assert.equal((await a.latest()).digest(), stats.digest);
});

test("commits ride out a service restart", async (t) => {
  const svc = await startService(t);
  const db = await MeldDB.connect(svc.ws, { ...opts("restart"), attempts: 50 });
  t.after(() => db.close());
  await db.transact((tx) => tx.put("before", "1"));
  await svc.stop();
  const pending = db.transact((tx) => tx.put("during", "2"));
  await new Promise((r) => setTimeout(r, 300));
  await svc.restart();
  const out = await pending;
  assert.equal(out.committed, true);
  const snap = await db.latest();
  assert.equal(snap.getString("before"), "1");
  assert.equal(snap.getString("during"), "2");
  // A node connecting now melds the same log to the same digest.
  const other = await MeldDB.connect(svc.ws, opts("restart"));
  t.after(() => other.close());
  assert.equal((await other.latest()).digest(), snap.digest());
});

test("an append whose answer is lost is resent and applied once", async (t) => {
  const svc = await startService(t);
  // A WebSocket that closes itself instead of delivering the first
  // AppendedBatch answer (type 108): the append reached the log, the
  // client never heard.
  let dropped = 0;
  let armed = false;
  class Lossy extends WebSocket {
    constructor(url) {
      super(url);
      this.binaryType = "arraybuffer";
      const deliver = (ev) => {
        const type = new Uint8Array(ev.data)[1];
        if (type === 108 && armed && dropped === 0) {
          dropped++;
          this.terminate();
          return;
        }
        this.onmessageUser?.(ev);
      };
      super.onmessage = deliver;
    }
    set onmessage(f) {
      this.onmessageUser = f;
    }
    get onmessage() {
      return this.onmessageUser;
    }
  }
  const db = await MeldDB.connect(svc.ws, { ...opts("lossy"), WebSocket: Lossy });
  t.after(() => db.close());
  const log = await ServiceLog.open(svc.ws, opts("lossy"));
  t.after(() => log.close());
  const before = await log.tail();
  // Armed now: the answer dropped is the transaction's, not the genesis append's.
  armed = true;
  const out = await db.transact((tx) => tx.put("once", "1"));
  assert.equal(dropped, 1);
  assert.equal(out.committed, true);
  assert.equal(await log.tail(), before + 1);
});

test("refusals and bad arguments are typed errors", async (t) => {
  const svc = await startService(t);
  await assert.rejects(MeldDB.connect(svc.ws, { log: "x", token: "nobody" }), (e) => {
    assert.ok(e instanceof MeldConnectionError, String(e));
    assert.equal(e.code, "Unauthorized");
    return true;
  });
  await assert.rejects(MeldDB.connect(svc.ws, { log: "bad name!", token: "writer" }), MeldArgumentError);
  await assert.rejects(MeldDB.connect("ftp://127.0.0.1:1", opts("x")), MeldArgumentError);
  await assert.rejects(MeldDB.connect("ws://127.0.0.1:9", opts("x")), MeldConnectionError);
  // A reader may follow a log but not append to it.
  const w = await MeldDB.connect(svc.ws, opts("ro"));
  t.after(() => w.close());
  await w.transact((tx) => tx.put("k", "v"));
  const r = await MeldDB.connect(svc.ws, { log: "ro", token: "reader" });
  t.after(() => r.close());
  assert.equal((await r.latest()).getString("k"), "v");
  await assert.rejects(r.transact((tx) => tx.put("k", "mine")), (e) => e instanceof MeldConnectionError && e.code === "Forbidden");
});
