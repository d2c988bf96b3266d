// The package's API on in-memory logs, checked against model maps.
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  MeldDB,
  MemoryLog,
  MeldAbortError,
  MeldArgumentError,
  MeldStateError,
} from "melddb";

const enc = new TextEncoder();
const dec = new TextDecoder();
const text = (b) => (b === undefined ? undefined : dec.decode(b));

// A small deterministic generator (xorshift32), so a failure names its seed.
function rng(seed) {
  let s = seed >>> 0 || 1;
  return (n) => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) % n;
  };
}

function cmp(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return a.length - b.length;
}

test("put, get and delete, with strings and bytes", async () => {
  const db = await MeldDB.memory();
  const out = await db.transact((tx) => {
    tx.put("alice", "100");
    tx.put(new Uint8Array([0, 255]), new Uint8Array([1, 2, 3]));
    return "done";
  });
  assert.equal(out.committed, true);
  assert.equal(out.value, "done");
  assert.equal(out.pos, 1);
  const snap = db.snapshot();
  assert.equal(snap.getString("alice"), "100");
  assert.deepEqual(snap.get(new Uint8Array([0, 255])), new Uint8Array([1, 2, 3]));
  assert.equal(snap.get("bob"), undefined);
  await db.transact((tx) => {
    assert.equal(tx.delete("alice"), true);
    assert.equal(tx.delete("alice"), false);
  });
  // The older snapshot still sees what it saw.
  assert.equal(snap.getString("alice"), "100");
  assert.equal(db.snapshot().get("alice"), undefined);
  db.close();
});

test("a transaction that writes nothing logs nothing", async () => {
  const log = new MemoryLog();
  const db = await MeldDB.memory({ log });
  const before = log.length;
  const out = await db.transact((tx) => tx.get("x"));
  assert.equal(out.readOnly, true);
  assert.equal(log.length, before);
  db.close();
});

test("nodes on one log reach the same state and digest", async () => {
  const log = new MemoryLog();
  const a = await MeldDB.memory({ log });
  const b = await MeldDB.memory({ log });
  for (let i = 0; i < 50; i++) {
    const db = i % 2 === 0 ? a : b;
    await db.transact((tx) => tx.put(`k${i % 7}`, `v${i}`));
  }
  const [sa, sb] = [await a.latest(), await b.latest()];
  assert.equal(sa.pos, log.length - 1);
  assert.equal(sa.digest(), sb.digest());
  assert.equal(sa.getString("k0"), "v49");
  // A node that joins later melds the same log to the same digest.
  const c = await MeldDB.memory({ log });
  assert.equal((await c.latest()).digest(), sa.digest());
  for (const db of [a, b, c]) db.close();
});

test("a conflict aborts with its reason and key; transact retries it", async () => {
  const log = new MemoryLog();
  const a = await MeldDB.memory({ log });
  const b = await MeldDB.memory({ log });
  await a.transact((tx) => tx.put("x", "0"));
  const t1 = a.begin();
  assert.equal(t1.getString("x"), "0");
  await b.transact((tx) => tx.put("x", "1"));
  t1.put("y", "from t1");
  const o = await t1.commit();
  assert.equal(o.committed, false);
  assert.equal(o.reason, "ReadWrite");
  assert.equal(text(o.key), "x");
  assert.throws(() => t1.get("x"), MeldStateError);

  // transact: with no retries the abort is an error carrying the same facts.
  let runs = 0;
  const race = async (retries) =>
    a.transact(
      async (tx) => {
        runs++;
        const v = tx.getString("x");
        if (runs === 1) await b.transact((t) => t.put("x", "2"));
        tx.put("x", `${v}+`);
      },
      { retries },
    );
  await assert.rejects(race(0), (e) => {
    assert.ok(e instanceof MeldAbortError);
    assert.equal(e.name, "MeldAbortError");
    assert.equal(e.reason, "WriteWrite");
    assert.equal(text(e.key), "x");
    return true;
  });
  runs = 0;
  const ok = await race(3);
  assert.equal(ok.committed, true);
  assert.equal(runs, 2);
  assert.equal((await b.latest()).getString("x"), "2+");
  a.close();
  b.close();
});

test("snapshot isolation lets a read-write conflict commit", async () => {
  const log = new MemoryLog();
  const a = await MeldDB.memory({ log });
  const b = await MeldDB.memory({ log });
  const t1 = a.begin({ isolation: "snapshot" });
  t1.get("x");
  await b.transact((tx) => tx.put("x", "1"));
  t1.put("y", "1");
  assert.equal((await t1.commit()).committed, true);
  a.close();
  b.close();
});

test("ranges agree with a model map under every option", async () => {
  const db = await MeldDB.memory();
  const next = rng(7);
  const model = new Map();
  // More keys than one chunk (256), with a shared prefix space.
  for (let round = 0; round < 4; round++) {
    await db.transact((tx) => {
      for (let i = 0; i < 300; i++) {
        const k = `${"abc"[next(3)]}${String(next(500)).padStart(3, "0")}`;
        if (next(5) === 0) {
          tx.delete(k);
          model.delete(k);
        } else {
          tx.put(k, `${round}:${i}`);
          model.set(k, `${round}:${i}`);
        }
      }
    });
  }
  const keys = [...model.keys()].map((k) => enc.encode(k)).sort(cmp);
  const snap = db.snapshot();
  const tx = db.begin();
  const cases = [
    {},
    { reverse: true },
    { gte: "b", lt: "c" },
    { gt: "a250", lte: "b100", reverse: true },
    { prefix: "c" },
    { prefix: "c", gte: "c300", limit: 40 },
    { prefix: "b", reverse: true, limit: 300 },
    { limit: 0 },
    { gte: "z" },
  ];
  for (const opts of cases) {
    let want = keys.filter((k) => {
      const s = dec.decode(k);
      if (opts.gte !== undefined && s < opts.gte) return false;
      if (opts.gt !== undefined && s <= opts.gt) return false;
      if (opts.lte !== undefined && s > opts.lte) return false;
      if (opts.lt !== undefined && s >= opts.lt) return false;
      if (opts.prefix !== undefined && !s.startsWith(opts.prefix)) return false;
      return true;
    });
    if (opts.reverse) want.reverse();
    if (opts.limit !== undefined) want = want.slice(0, opts.limit);
    const wantPairs = want.map((k) => [dec.decode(k), model.get(dec.decode(k))]);
    const got = [];
    for await (const [k, v] of snap.range(opts)) got.push([text(k), text(v)]);
    assert.deepEqual(got, wantPairs, JSON.stringify(opts));
    const gotTx = tx.range(opts).toArray().map(([k, v]) => [text(k), text(v)]);
    assert.deepEqual(gotTx, wantPairs, `tx ${JSON.stringify(opts)}`);
  }
  // A transaction's range sees its own writes.
  tx.put("a000-new", "mine");
  const mine = [...tx.range({ prefix: "a000" })].map(([k]) => text(k));
  assert.ok(mine.includes("a000-new"));
  tx.abandon();
  assert.throws(() => snap.range({ gte: "a", gt: "b" }).toArray(), MeldArgumentError);
  assert.throws(() => snap.range({ limit: -1 }), MeldArgumentError);
  db.close();
});

test("a serializable range stopped early guards the chunks it fetched, not the whole range", async () => {
  const log = new MemoryLog();
  const a = await MeldDB.memory({ log });
  const b = await MeldDB.memory({ log });
  await a.transact((tx) => {
    for (let i = 0; i < 1000; i++) tx.put(`r/${String(i).padStart(4, "0")}`, "x");
  });
  const readThreeThenCommit = async (inserted) => {
    const tx = a.begin();
    let n = 0;
    for (const [k] of tx.range({ prefix: "r/" })) {
      assert.equal(text(k), `r/000${n}`);
      if (++n === 3) break;
    }
    tx.put("reader", inserted);
    await b.transact((t) => t.put(inserted, "new"));
    return tx.commit();
  };
  // Key 100 is past the first chunk (16 pairs) but inside what a fixed 256-pair chunk would guard.
  assert.equal((await readThreeThenCommit("r/0100a")).committed, true);
  const near = await readThreeThenCommit("r/0001a");
  assert.equal(near.committed, false);
  assert.equal(near.reason, "Phantom");
  a.close();
  b.close();
});

test("bad arguments are typed errors, never a crash", async () => {
  const db = await MeldDB.memory();
  const tx = db.begin();
  assert.throws(() => tx.put(new Uint8Array(5000), "v"), (e) => {
    assert.ok(e instanceof MeldArgumentError);
    assert.equal(e.code, "KeyTooLong");
    return true;
  });
  assert.throws(() => tx.put("k", new Uint8Array(2 << 20)), (e) => e instanceof MeldArgumentError && e.code === "ValueTooLarge");
  assert.throws(() => tx.put(42, "v"), TypeError);
  assert.throws(() => db.begin({ isolation: "chaos" }), MeldArgumentError);
  assert.throws(() => db.begin({ isolation: "toString" }), MeldArgumentError);
  await assert.rejects(db.transact(() => {}, { retries: -1 }), MeldArgumentError);
  // The transaction is still usable after a rejected argument.
  tx.put("k", "v");
  assert.equal((await tx.commit()).committed, true);
  // A callback that throws commits nothing.
  await assert.rejects(
    db.transact((t) => {
      t.put("k", "other");
      throw new Error("changed my mind");
    }),
    /changed my mind/,
  );
  assert.equal(db.snapshot().getString("k"), "v");
  db.close();
  assert.throws(() => db.snapshot(), MeldStateError);
  assert.throws(() => db.begin(), MeldStateError);
});

test("watch delivers the committed changes under a prefix, in log order", async () => {
  const log = new MemoryLog();
  const a = await MeldDB.memory({ log });
  const b = await MeldDB.memory({ log });
  const seen = [];
  const stop = a.watch("user/", (c) => seen.push([c.pos, c.changes.map((x) => [text(x.key), text(x.value)])]));
  await b.transact((tx) => {
    tx.put("user/1", "ann");
    tx.put("other", "x");
  });
  await b.transact((tx) => tx.delete("user/1"));
  await b.transact((tx) => tx.delete("user/never"));
  await b.transact((tx) => tx.put("other", "y"));
  await a.latest();
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(seen, [
    [1, [["user/1", "ann"]]],
    [2, [["user/1", undefined]]],
  ]);
  stop();
  await b.transact((tx) => tx.put("user/2", "bo"));
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(seen.length, 2);
  a.close();
  b.close();
});

test("random histories on three nodes match a serial replay of the committed ones", async () => {
  for (const seed of [1, 2, 3]) {
    const next = rng(seed);
    const log = new MemoryLog();
    const nodes = [];
    for (let i = 0; i < 3; i++) nodes.push(await MeldDB.memory({ log }));
    const open = [];
    const history = [];
    for (let step = 0; step < 300; step++) {
      if (open.length < 4 && next(3) !== 0) {
        const db = nodes[next(3)];
        open.push({ tx: db.begin(), ops: [], writes: 0 });
        continue;
      }
      if (open.length === 0) continue;
      const t = open[next(open.length)];
      const key = `k${next(12)}`;
      const op = next(4);
      if (op === 0) t.ops.push(["r", key, t.tx.getString(key)]);
      else if (op === 1 && t.writes > 0) {
        open.splice(open.indexOf(t), 1);
        history.push({ ...t, outcome: await t.tx.commit() });
      } else {
        const v = `${seed}.${step}`;
        t.tx.put(key, v);
        t.ops.push(["w", key, v]);
        t.writes++;
      }
    }
    // Replay the committed ones serially in log order on a model map: each
    // must have read exactly what the model held at its position.
    const committed = history.filter((h) => h.outcome.committed).sort((x, y) => x.outcome.pos - y.outcome.pos);
    assert.ok(committed.length > 10, `seed ${seed}: only ${committed.length} commits`);
    assert.ok(history.length > committed.length, `seed ${seed}: no aborts to check`);
    const model = new Map();
    for (const h of committed) {
      // Reads see the model plus the transaction's own earlier writes.
      const mine = new Map();
      for (const [op, k, v] of h.ops) {
        if (op === "w") mine.set(k, v);
        else assert.equal(v, mine.has(k) ? mine.get(k) : model.get(k), `seed ${seed}: pos ${h.outcome.pos} read ${k}`);
      }
      for (const [k, v] of mine) model.set(k, v);
    }
    const snaps = await Promise.all(nodes.map((n) => n.latest()));
    for (const [k, v] of model) assert.equal(snaps[0].getString(k), v, `seed ${seed}: final ${k}`);
    assert.equal(snaps[0].range().toArray().length, model.size);
    assert.equal(new Set(snaps.map((s) => s.digest())).size, 1);
    for (const t of open) t.tx.abandon();
    for (const n of nodes) n.close();
  }
});
