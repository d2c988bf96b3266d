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
import { MeldDB, ServiceLog, MemoryStore, MeldConnectionError, MeldArgumentError, MeldStorageError } from "melddb";
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

test("under group meld and premeld, concurrent JavaScript nodes and a native node reach one state", async (t) => {
  const svc = await startService(t);
  const settings = { groupMeld: true, premeldThreads: 2, premeldDistance: 4, dbId: 9 };
  const a = await MeldDB.connect(svc.ws, { ...opts("pairs"), settings });
  const b = await MeldDB.connect(svc.ws, opts("pairs"));
  t.after(() => {
    a.close();
    b.close();
  });
  // Transfers between 8 accounts from both nodes at once: pairs form,
  // lone heads get fillers, conflicts abort and retry.
  await a.transact((tx) => {
    for (let i = 0; i < 8; i++) tx.put(`acct/${i}`, "100");
  });
  let seed = 5;
  const next = (n) => (seed = (seed * 1103515245 + 12345) % 2147483648) % n;
  const transfer = (db) =>
    db.transact(
      (tx) => {
        const from = `acct/${next(8)}`;
        const to = `acct/${next(8)}`;
        const amount = 1 + next(5);
        tx.put(from, String(Number(tx.getString(from)) - amount));
        tx.put(to, String(Number(tx.getString(to)) + amount));
      },
      { retries: 50 },
    );
  for (let round = 0; round < 15; round++) await Promise.all([transfer(a), transfer(b), transfer(a), transfer(b)]);
  const total = (snap) => [...snap.range({ prefix: "acct/" })].reduce((sum, [, v]) => sum + Number(new TextDecoder().decode(v)), 0);
  const snapA = await a.latest();
  assert.equal(total(snapA), 800);

  const melddb = binary("melddb-cli", "melddb");
  const dir = mkdtempSync(join(tmpdir(), "melddb-native-pairs-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const stats = JSON.parse(
    execFileSync(melddb, ["--dir", dir, "--log", `melddb://${svc.tcp}/pairs`, "--token", "writer", "stats", "--json"], { encoding: "utf8" }),
  );
  const snapB = await b.latest();
  assert.equal(snapA.pos, stats.last_position);
  assert.equal(snapA.digest(), stats.digest);
  assert.equal(snapB.digest(), stats.digest);
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
  // Options are checked before anything is sent.
  for (const bad of [{ attempts: -1 }, { attempts: Number.NaN }, { attempts: 1.5 }, { token: "t".repeat(70000) }]) {
    await assert.rejects(MeldDB.connect(svc.ws, { ...opts("x"), ...bad }), MeldArgumentError, JSON.stringify(bad).slice(0, 40));
  }
  for (const settings of [{ dbId: -1 }, { dbId: 1.5 }, { maxConflictZone: Number.NaN }, { groupMeld: "yes" }, { premeldThreads: -2 }]) {
    await assert.rejects(MeldDB.connect(svc.ws, { ...opts("fresh"), settings }), MeldArgumentError, JSON.stringify(settings));
    await assert.rejects(MeldDB.memory({ settings }), MeldArgumentError, JSON.stringify(settings));
  }
});

test("appends in one turn are split into frames the service takes; oversized ones fail, never loop", async (t) => {
  // The test service takes records up to 1 MiB and frames up to 2 MiB.
  const svc = await startService(t);
  const log = await ServiceLog.open(svc.ws, { ...opts("big"), attempts: 2 });
  t.after(() => log.close());
  const entry = (n, fill) => new Uint8Array(n).fill(fill);
  // Three 900 KB entries in one turn: one frame would be 2.7 MB.
  const positions = await Promise.all([1, 2, 3].map((i) => log.append(entry(900_000, i))));
  assert.deepEqual(positions, [0, 1, 2]);
  assert.equal((await log.read(2))[0], 3);
  // A record over the service's limit: refused under its request.
  await assert.rejects(log.append(entry(1_500_000, 9)), (e) => e instanceof MeldArgumentError && e.code === "TooLarge");
  // A frame over the service's frame limit: the service closes the
  // connection; the append fails instead of being resent forever, and
  // the log stays usable.
  await assert.rejects(log.append(entry(3_000_000, 9)), (e) => e instanceof MeldArgumentError && e.code === "TooLarge");
  assert.equal(await log.append(entry(10, 4)), 3);
  assert.equal(await log.tail(), 4);
});

test("a node joins a trimmed log from its latest published checkpoint, skipping bad pointers", async (t) => {
  const svc = await startService(t);
  const a = await MeldDB.connect(svc.ws, opts("long"));
  t.after(() => a.close());
  const melddb = binary("melddb-cli", "melddb");
  const dir = mkdtempSync(join(tmpdir(), "melddb-publisher-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  // A native node that publishes checkpoints (and trims below the one before the latest).
  const publish = () =>
    execFileSync(melddb, ["--dir", dir, "--log", `melddb://${svc.tcp}/long`, "--token", "writer", "--publish-checkpoints", "checkpoint", "--json"], {
      encoding: "utf8",
    });
  for (let round = 0; round < 3; round++) {
    for (let i = 0; i < 30; i++) {
      await a.transact((tx) => {
        tx.put(`k/${round}/${i}`, `v${i}`);
        tx.put("counter", String(Number(tx.getString("counter") ?? "0") + 1));
      });
    }
    publish();
  }
  await a.transact((tx) => tx.put("after", "checkpoints"));
  const log = await ServiceLog.open(svc.ws, opts("long"));
  t.after(() => log.close());
  const { first, tail } = await log.bounds();
  assert.ok(first > 0, `the publisher trimmed the log (first ${first})`);

  // A stranger's record in the companion log is skipped.
  const companion = await ServiceLog.open(svc.ws, opts("long.ckpt"));
  t.after(() => companion.close());
  await companion.append(new TextEncoder().encode("not a pointer"));

  const b = await MeldDB.connect(svc.ws, opts("long"));
  t.after(() => b.close());
  const stats = b.stats();
  assert.ok(stats.startedAt >= first, `started at ${stats.startedAt}, the log starts at ${first}`);
  assert.equal(stats.nextPos, tail);
  assert.equal(stats.melded, tail - stats.startedAt - 1);
  const snap = await b.latest();
  assert.equal(snap.getString("counter"), "90");
  assert.equal(snap.getString("after"), "checkpoints");
  assert.equal(snap.digest(), (await a.latest()).digest());
  // It commits like any node, and the others see it.
  await b.transact((tx) => tx.put("from", "b"));
  assert.equal((await a.latest()).getString("from"), "b");
});

test("a node with a store resumes from its checkpoint and tail and catches up, not melding the log again", async (t) => {
  const svc = await startService(t);
  const writer = await MeldDB.connect(svc.ws, opts("resume"));
  t.after(() => writer.close());
  const write = async (n, tag) => {
    for (let i = 0; i < n; i++) await writer.transact((tx) => tx.put(`${tag}/${i}`, "v".repeat(200)), { retries: 50 });
  };
  await write(20, "early");
  const store = new MemoryStore();
  const withStore = { ...opts("resume"), store, checkpointBytes: 2000 };
  const a = await MeldDB.connect(svc.ws, withStore);
  assert.equal(a.stats().startedAt, 0);
  // Enough log that the node appends begin records and checkpoints at them.
  await write(60, "middle");
  await a.latest();
  await a.flush();
  const left = a.stats().nextPos;
  a.close();
  await a.closed();
  const saved = await store.load();
  assert.ok(saved.checkpoint !== undefined, "the store holds a checkpoint");
  assert.equal(saved.first + saved.tail.length, left);

  await write(10, "late");
  const b = await MeldDB.connect(svc.ws, withStore);
  t.after(() => b.close());
  const st = b.stats();
  const tail = await writer.latest().then((s) => s.pos + 1);
  assert.equal(st.startedAt, saved.first);
  assert.equal(st.restored, saved.tail.length - 1);
  assert.equal(st.melded, tail - left, "only the entries after the store's were read from the log");
  assert.equal((await b.latest()).digest(), (await writer.latest()).digest());
  await b.transact((tx) => tx.put("from", "b"));
  assert.equal((await writer.latest()).getString("from"), "b");
  b.close();
  await b.closed();

  // A store of another log is emptied; the node starts from that log's beginning.
  const other = await MeldDB.connect(svc.ws, { ...opts("other"), store });
  t.after(() => other.close());
  assert.equal(other.stats().restored, 0);
  assert.equal(other.stats().startedAt, 0);
  await other.flush();
  assert.equal((await store.load()).log, "other");
});

test("a failing store is reported once as MeldStorageError and the node goes on", async (t) => {
  const svc = await startService(t);
  const errors = [];
  const failing = {
    load: async () => undefined,
    reset: async () => {
      throw new MeldStorageError("quota exceeded", "Quota");
    },
    append: async () => undefined,
    clear: async () => undefined,
    close: async () => undefined,
  };
  const db = await MeldDB.connect(svc.ws, { ...opts("failing"), store: failing, onStorageError: (e) => errors.push(e) });
  t.after(() => db.close());
  await db.transact((tx) => tx.put("k", "v"));
  await assert.rejects(db.flush(), (e) => e instanceof MeldStorageError && e.code === "Quota");
  assert.equal(errors.length, 1);
  assert.equal((await db.latest()).getString("k"), "v");

  // A store that cannot be read: reported as MeldStorageError, the node joins without it.
  const unreadable = { ...failing, load: async () => Promise.reject(new Error("disk on fire")) };
  const seen = [];
  const db2 = await MeldDB.connect(svc.ws, { ...opts("failing"), store: unreadable, onStorageError: (e) => seen.push(e) });
  t.after(() => db2.close());
  assert.equal(seen.length, 1);
  assert.ok(seen[0] instanceof MeldStorageError && /disk on fire/.test(seen[0].message), String(seen[0]));
  assert.equal((await db2.latest()).getString("k"), "v");

  // Contents that contradict themselves are emptied, never melded.
  let cleared = 0;
  const inconsistent = {
    ...failing,
    load: async () => ({ log: "failing", checkpoint: undefined, first: 1, tail: [new Uint8Array(3)] }),
    clear: async () => void cleared++,
  };
  const db3 = await MeldDB.connect(svc.ws, { ...opts("failing"), store: inconsistent, onStorageError: () => {} });
  t.after(() => db3.close());
  assert.equal(cleared, 1);
  assert.equal(db3.stats().restored, 0);
  assert.equal((await db3.latest()).getString("k"), "v");

  await assert.rejects(MeldDB.connect(svc.ws, { ...opts("failing"), store: { load() {} } }), MeldArgumentError);
});
