/**
 * A MeldDB node in JavaScript: it follows one log, melds every entry in
 * the wasm module, begins transactions on its latest committed state and
 * appends their intentions. All work runs on the caller's event loop.
 */
import * as raw from "../pkg/melddb_wasm.js";
import { type Bytes, hasPrefix, toBytes } from "./bytes.js";
import {
  type AbortReason,
  MeldAbortError,
  MeldArgumentError,
  MeldLogError,
  MeldStateError,
  MeldStorageError,
  call,
} from "./errors.js";
import { fromPublished } from "./join.js";
import { Persister, type Restored, restore } from "./persist.js";
import type { NodeStore } from "./store.js";
import { type LogClient, MemoryLog } from "./log.js";
import { ServiceLog, type WebSocketConstructor } from "./remote.js";
import { Snapshot, disposeSymbol } from "./read.js";
import { type Isolation, type Outcome, type Committed, Transaction, isolationCode } from "./transaction.js";
import { loadWasm } from "./wasm.js";

/** Database-wide settings, fixed by the genesis record when the log is created. */
export interface Settings {
  /** The database's identifier (default 0). */
  dbId?: number | bigint;
  /** Longest conflict zone in log entries (default 1024). */
  maxConflictZone?: number;
  /** Premeld threads t (default 0: off). */
  premeldThreads?: number;
  /** Premeld distance d (at least 1 with premeld on). */
  premeldDistance?: number;
  /** Group meld of adjacent pairs (default off). */
  groupMeld?: boolean;
}

/** Options of `MeldDB.memory`. */
export interface MemoryOptions {
  /** The log to share with other nodes (default: a new one). */
  log?: MemoryLog;
  /** Settings for a new log's genesis record (ignored if the log has one). */
  settings?: Settings;
}

/** Options of `MeldDB.connect`. */
export interface ConnectOptions {
  /** The log's name on the service. */
  log: string;
  /** A token of the service's `[tokens]` (sent in Hello). */
  token?: string;
  /** Settings for the genesis record if the log is empty. */
  settings?: Settings;
  /** Reconnections an append rides out before it fails (default 8). */
  attempts?: number;
  /** A WebSocket constructor in place of the platform's. */
  WebSocket?: WebSocketConstructor;
  /**
   * Where the node keeps its checkpoint and the log it melded since, to
   * resume there on the next `connect` (`openBrowserStore` in browsers,
   * `MemoryStore`, or your own). Without it the node joins from the
   * latest published checkpoint every time.
   */
  store?: NodeStore;
  /** Log bytes melded between the store's checkpoints (default 4 MiB). */
  checkpointBytes?: number;
  /** Called once if the store fails; the node goes on without it (default: `console.warn`). */
  onStorageError?: (e: MeldStorageError) => void;
}

/** Options of `transact`. */
export interface TransactOptions {
  /** Isolation level (default "serializable"). */
  isolation?: Isolation;
  /** Attempts after the first when it aborts (default 10). */
  retries?: number;
}

/** One key's committed change: its new value, or undefined for a deletion. */
export interface Change {
  key: Uint8Array;
  value: Uint8Array | undefined;
}

/** The changes one committed transaction made under a watched prefix. */
export interface Commit {
  pos: number;
  changes: Change[];
}

/** Where a node started and how much of the log it has melded since. */
export interface NodeStats {
  /** The position of the state it started from: 0 (the genesis record) or a checkpoint's begin record. */
  startedAt: number;
  /** Log entries it has melded from the log since it started. */
  melded: number;
  /** Entries it melded again from its store when it started. */
  restored: number;
  /** The position of the next entry it will meld. */
  nextPos: number;
}

/** The result of `transact`: the outcome and what the callback returned. */
export type TransactResult<T> = Committed & { value: T };

interface Watcher {
  prefix: Uint8Array;
  callback: (commit: Commit) => void;
}

/** Whether `s` has the methods of a `NodeStore`. */
function isStore(s: unknown): s is NodeStore {
  const o = s as Record<string, unknown> | null;
  return typeof o === "object" && o !== null && ["load", "reset", "append", "clear", "close"].every((m) => typeof o[m] === "function");
}

/** Hands a store failure to the user's callback, which must not break the node by throwing. */
function report(callback: (e: MeldStorageError) => void, e: MeldStorageError): void {
  try {
    callback(e);
  } catch {
    // The failure was reported; the callback's own error is not the node's.
  }
}

/** A settings field that must be an integer in `[0, max]`. */
function whole(s: Settings, field: "maxConflictZone" | "premeldThreads" | "premeldDistance", fallback: number): number {
  const v = s[field] ?? fallback;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > 0xffffffff) {
    throw new MeldArgumentError(`settings.${field} must be an integer from 0 to 2^32-1, not ${String(v)}`, "Settings");
  }
  return v;
}

function genesisOf(s: Settings): Uint8Array {
  if (typeof s !== "object" || s === null) throw new MeldArgumentError("settings must be an object", "Settings");
  const id = s.dbId ?? 0;
  const idOk = typeof id === "bigint" ? id >= 0n && id < 1n << 64n : Number.isSafeInteger(id) && id >= 0;
  if (!idOk) throw new MeldArgumentError(`settings.dbId must be an integer from 0 to 2^64-1, not ${String(id)}`, "Settings");
  const group = s.groupMeld ?? false;
  if (typeof group !== "boolean") throw new MeldArgumentError(`settings.groupMeld must be a boolean, not ${String(group)}`, "Settings");
  return call(() =>
    raw.genesisRecord(
      BigInt(id),
      whole(s, "maxConflictZone", 1024),
      whole(s, "premeldThreads", 0),
      whole(s, "premeldDistance", 0),
      group,
    ),
  );
}

function outcomeOf(d: raw.Decision): Outcome {
  if (d.committed) return { committed: true, pos: d.pos, csn: d.csn, readOnly: false };
  return {
    committed: false,
    pos: d.pos,
    reason: (d.reason ?? "Malformed") as AbortReason,
    key: d.key,
    message: d.message,
  };
}

/** A database node on one log. */
export class MeldDB {
  readonly #log: LogClient;
  #ownsLog = false;
  #node: raw.Node | undefined;
  #unsubscribe: (() => void) | undefined;
  /**
   * Decisions at or past the lowest position an own append in flight can
   * land at, by position, until that append's committer takes its own.
   */
  readonly #decided = new Map<number, Outcome>();
  readonly #waiting = new Map<number, { resolve: (o: Outcome) => void; reject: (e: unknown) => void }>();
  /** Own appends in flight, by the lowest position each can land at. */
  readonly #floors = new Map<number, number>();
  /** Waits for the node to reach a position. */
  readonly #reach: Array<{ pos: number; resolve: () => void; reject: (e: unknown) => void }> = [];
  readonly #watchers = new Set<Watcher>();
  #failed: unknown;
  #startedAt = 0;
  #melded = 0;
  #restored = 0;
  #persister: Persister | undefined;
  #closing: Promise<void> = Promise.resolve();

  private constructor(log: LogClient) {
    this.#log = log;
  }

  /** A node on an in-memory log: a new one, or `options.log` shared with other nodes. */
  static async memory(options: MemoryOptions = {}): Promise<MeldDB> {
    await loadWasm();
    const log = options.log ?? new MemoryLog();
    if (log.length === 0) log.appendNow(genesisOf(options.settings ?? {}));
    return MeldDB.follow(log);
  }

  /**
   * A node on a log of the log service, over its WebSocket (`url`:
   * `ws://HOST:PORT`, or `http://HOST:PORT`, path `/v1/ws` by default).
   * An empty log gets a genesis record with `options.settings`. The node
   * starts from the latest checkpoint published in the companion log
   * `LOG.ckpt` that loads and verifies (a native node with
   * `publish_checkpoints` writes them), else from the genesis record.
   * Resolves once the node has melded the log up to the tail it found.
   * Rejects with `MeldConnectionError` if the service is unreachable or
   * refuses the token, `MeldLogError` (`Trimmed`) if the log is trimmed
   * and no published checkpoint loads.
   */
  static async connect(url: string, options: ConnectOptions): Promise<MeldDB> {
    await loadWasm();
    const checkpointBytes = options.checkpointBytes ?? 4 << 20;
    if (typeof checkpointBytes !== "number" || !Number.isSafeInteger(checkpointBytes) || checkpointBytes < 1) {
      throw new MeldArgumentError(`checkpointBytes must be a positive integer, not ${String(checkpointBytes)}`, "CheckpointBytes");
    }
    let store = options.store;
    if (store !== undefined && !isStore(store)) {
      throw new MeldArgumentError("store must have the NodeStore methods load, reset, append, clear and close", "Store");
    }
    const onStorageError = options.onStorageError ?? ((e: MeldStorageError) => console.warn(`melddb: ${e.message}`));
    if (typeof onStorageError !== "function") throw new MeldArgumentError("onStorageError must be a function", "OnStorageError");
    const log = await ServiceLog.open(url, options);
    let node: raw.Node | undefined;
    let persister: Persister | undefined;
    let db: MeldDB | undefined;
    try {
      if ((await log.bounds()).tail === 0) await log.append(genesisOf(options.settings ?? {}));
      const skipped: string[] = [];
      let local: Restored | undefined;
      if (store !== undefined) {
        try {
          local = await restore(store, log, options.log, skipped);
        } catch (e) {
          if (!(e instanceof MeldStorageError)) throw e;
          // A store that cannot be read is reported; the node goes on without it.
          report(onStorageError, e);
          await store.close().catch(() => undefined);
          store = undefined;
        }
      }
      node = local?.node;
      persister = store === undefined ? undefined : new Persister(store, options.log, checkpointBytes, onStorageError);
      // A published checkpoint past what the store holds is the shorter way.
      const joined = await fromPublished(log, options.log, local?.last ?? -1, skipped, store !== undefined);
      if (joined.node !== undefined) {
        node?.free();
        node = joined.node;
        persister?.startAt(joined.begin, joined.parts, await log.read(joined.begin));
        db = await MeldDB.#start(log, joined.node, joined.begin, joined.begin + 1, persister);
      } else if (local !== undefined) {
        persister?.resumed(local.last, local.tailBytes);
        db = await MeldDB.#start(log, local.node, local.begin, local.last + 1, persister);
        db.#restored = local.restored;
      } else {
        const { first } = await log.bounds();
        if (first > 0) {
          const why = skipped.length > 0 ? ` (${skipped.join("; ")})` : "";
          throw new MeldLogError(
            `log ${options.log} is trimmed below position ${first} and no published checkpoint of it loads${why}; a node that publishes checkpoints must write one first`,
            "Trimmed",
          );
        }
        node = undefined;
        db = await MeldDB.#start(log, undefined, 0, 0, persister);
      }
      node = undefined;
      db.#ownsLog = true;
      await db.latest();
      return db;
    } catch (e) {
      if (db !== undefined) {
        // The node, its log and its store (after its pending writes) go with it.
        db.#ownsLog = true;
        db.close();
        await db.closed().catch(() => undefined);
      } else {
        node?.free();
        log.close();
        if (persister !== undefined) await persister.close().catch(() => undefined);
        else await store?.close().catch(() => undefined);
      }
      throw e;
    }
  }


  /**
   * A node on any log: it melds the log from its genesis record (position
   * 0), which must exist (a creator appends it first).
   */
  static follow(log: LogClient): Promise<MeldDB> {
    return MeldDB.#start(log, undefined, 0, 0, undefined);
  }

  /**
   * A node melding `log` from position `from` on, starting from `node`
   * (the state before `from`, which began at checkpoint position
   * `startedAt`), or from the genesis record.
   */
  static async #start(log: LogClient, node: raw.Node | undefined, startedAt: number, from: number, persister: Persister | undefined): Promise<MeldDB> {
    await loadWasm();
    const db = new MeldDB(log);
    db.#node = node;
    db.#startedAt = startedAt;
    db.#persister = persister;
    // Only a node with a store checkpoints, so only it keeps the state at begin records.
    if (persister !== undefined) node?.keepBegin(true);
    if (node !== undefined) {
      db.#unsubscribe = log.subscribe(from, (pos, entry) => db.#onEntry(pos, entry), (e) => db.#fail(e));
      return db;
    }
    await new Promise<void>((resolve, reject) => {
      db.#unsubscribe = log.subscribe(0, (pos, entry) => {
        if (db.#node === undefined) {
          try {
            const genesis = call(() => new raw.Node(entry));
            if (persister !== undefined) genesis.keepBegin(true);
            db.#node = genesis;
            db.#persister?.melded(pos, entry, genesis);
            resolve();
          } catch (e) {
            db.#fail(e);
            reject(e);
          }
          return;
        }
        db.#onEntry(pos, entry);
      }, (e) => {
        db.#fail(e);
        reject(e);
      });
    });
    return db;
  }

  #live(): raw.Node {
    if (this.#failed !== undefined) throw this.#failed;
    if (this.#node === undefined) throw new MeldStateError("the database is closed", "Closed");
    return this.#node;
  }

  #onEntry(pos: number, entry: Uint8Array): void {
    const node = this.#node;
    if (node === undefined || this.#failed !== undefined) return;
    if (pos !== node.nextPos()) {
      this.#fail(new MeldLogError(`the log delivered position ${pos} where ${node.nextPos()} was next`, "Gap"));
      return;
    }
    let decisions: raw.Decision[];
    try {
      decisions = call(() => node.apply(entry));
    } catch (e) {
      this.#fail(e);
      return;
    }
    this.#melded++;
    const persister = this.#persister;
    if (persister !== undefined) {
      persister.melded(pos, entry, node);
      // No begin record for a while: append one, so the store can checkpoint.
      if (persister.wantsBegin()) this.#log.append(node.beginRecord()).catch((e: unknown) => persister.beginFailed(e));
    }
    for (const d of decisions) {
      const outcome = outcomeOf(d);
      if (this.#watchers.size > 0 && d.committed) this.#publish(d);
      d.free();
      const w = this.#waiting.get(outcome.pos);
      if (w !== undefined) {
        this.#waiting.delete(outcome.pos);
        w.resolve(outcome);
      } else if (this.#floors.size > 0 && outcome.pos >= this.#lowestFloor()) {
        this.#decided.set(outcome.pos, outcome);
      }
    }
    const next = node.nextPos();
    for (let i = this.#reach.length - 1; i >= 0; i--) {
      const r = this.#reach[i];
      if (r !== undefined && r.pos <= next) {
        this.#reach.splice(i, 1);
        r.resolve();
      }
    }
  }

  #publish(d: raw.Decision): void {
    const changes: Change[] = [];
    for (let i = 0; i < d.changeCount(); i++) {
      const key = d.changeKey(i);
      if (key !== undefined) changes.push({ key, value: d.changeValue(i) });
    }
    const pos = d.pos;
    for (const w of this.#watchers) {
      const mine = changes.filter((c) => hasPrefix(c.key, w.prefix));
      // Callbacks run after this entry's meld, never inside it.
      if (mine.length > 0) queueMicrotask(() => this.#watchers.has(w) && w.callback({ pos, changes: mine }));
    }
  }

  /** Stops the node: pending commits and waits reject with `e`. */
  #fail(e: unknown): void {
    this.#failed ??= e;
    for (const w of this.#reach.splice(0)) w.reject(e);
    for (const w of this.#waiting.values()) w.reject(e);
    this.#waiting.clear();
  }

  /** The latest committed state this node has melded. */
  snapshot(): Snapshot {
    const node = this.#live();
    return new Snapshot(node.snapshot());
  }

  /**
   * The latest committed state once this node has melded everything
   * appended to the log before the call: an up-to-date read.
   */
  async latest(): Promise<Snapshot> {
    const tail = await this.#log.tail();
    await this.#until(tail);
    return this.snapshot();
  }

  #until(pos: number): Promise<void> {
    const node = this.#live();
    if (node.nextPos() >= pos) return Promise.resolve();
    return new Promise((resolve, reject) => this.#reach.push({ pos, resolve, reject }));
  }

  /** Begins a transaction on the latest committed state this node has. */
  begin(options: { isolation?: Isolation } = {}): Transaction {
    const iso = options.isolation ?? "serializable";
    const code = Object.hasOwn(isolationCode, iso) ? isolationCode[iso] : undefined;
    if (code === undefined) {
      throw new MeldArgumentError(`isolation must be serializable, repeatable-read or snapshot, not ${String(iso)}`, "Isolation");
    }
    const node = this.#live();
    const txn = call(() => node.begin(code));
    const snap = node.snapshot();
    const at = { pos: snap.pos, csn: snap.csn };
    snap.free();
    return new Transaction(txn, this, at);
  }

  #lowestFloor(): number {
    let low = Infinity;
    for (const f of this.#floors.keys()) low = Math.min(low, f);
    return low;
  }

  /** @internal Appends a finished intention and resolves with its outcome. */
  async commitIntention(intention: Uint8Array): Promise<Outcome> {
    // The entry lands at or past the next position this node melds.
    const floor = this.#live().nextPos();
    this.#floors.set(floor, (this.#floors.get(floor) ?? 0) + 1);
    let pos: number;
    let known: Outcome | undefined;
    try {
      pos = await this.#log.append(intention);
      known = this.#decided.get(pos);
      this.#decided.delete(pos);
    } finally {
      const n = (this.#floors.get(floor) ?? 1) - 1;
      if (n === 0) this.#floors.delete(floor);
      else this.#floors.set(floor, n);
      // Decisions below every remaining append's floor are nobody's.
      const low = this.#lowestFloor();
      for (const p of this.#decided.keys()) if (p < low) this.#decided.delete(p);
    }
    if (known !== undefined) return known;
    this.#live();
    const decided = new Promise<Outcome>((resolve, reject) => this.#waiting.set(pos, { resolve, reject }));
    // The caller awaits `decided` only after the wait below; if the node
    // fails first, both reject, and this marks `decided` handled meanwhile.
    decided.catch(() => undefined);
    // With group meld an entry that heads a pair is decided with the next
    // one. If it is melded and still undecided, append an empty filler
    // (every node rejects it as malformed), as the core's Database does.
    await this.#until(pos + 1);
    if (this.#waiting.has(pos) && (await this.#log.tail()) === pos + 1 && this.#waiting.has(pos)) {
      await this.#log.append(new Uint8Array(0));
    }
    return decided;
  }

  /**
   * Runs `fn` in a transaction and commits it; an aborted attempt runs
   * again on a newer state, up to `retries` times, then rejects with
   * `MeldAbortError`. If `fn` throws, nothing is committed and the error
   * propagates.
   */
  async transact<T>(fn: (tx: Transaction) => T | Promise<T>, options: TransactOptions = {}): Promise<TransactResult<T>> {
    const retries = options.retries ?? 10;
    if (!Number.isInteger(retries) || retries < 0) {
      throw new MeldArgumentError(`retries must be a non-negative integer, not ${String(retries)}`, "Retries");
    }
    for (let attempt = 0; ; attempt++) {
      const tx = this.begin(options);
      let value: T;
      try {
        value = await fn(tx);
      } catch (e) {
        tx.abandon();
        throw e;
      }
      const outcome = await tx.commit();
      if (outcome.committed) return { ...outcome, value };
      if (attempt >= retries) throw new MeldAbortError(outcome.message, outcome.reason, outcome.key, outcome.pos);
    }
  }

  /**
   * Calls `callback` with the changes under `prefix` of each transaction
   * committed from now on, in log order. Returns the function that stops it.
   */
  watch(prefix: Bytes, callback: (commit: Commit) => void): () => void {
    const node = this.#live();
    const w: Watcher = { prefix: toBytes(prefix, "prefix").slice(), callback };
    this.#watchers.add(w);
    node.trackChanges(true);
    return () => {
      this.#watchers.delete(w);
      if (this.#watchers.size === 0) this.#node?.trackChanges(false);
    };
  }

  /** The position of the next log entry this node will meld. */
  get nextPos(): number {
    return this.#live().nextPos();
  }

  /** Where this node started and how many log entries it has melded since. */
  stats(): NodeStats {
    return { startedAt: this.#startedAt, melded: this.#melded, restored: this.#restored, nextPos: this.#live().nextPos() };
  }

  /**
   * Resolves once everything this node has melded is in its store (at
   * once without one); rejects with `MeldStorageError` if the store failed.
   */
  async flush(): Promise<void> {
    await this.#persister?.flush();
  }

  /** Stops following the log and releases the node; later calls throw `MeldStateError`. */
  close(): void {
    this.#unsubscribe?.();
    this.#unsubscribe = undefined;
    // What was melded still goes to the store, which then closes (and
    // releases its lock); `closed()` waits for it.
    this.#closing = this.#persister?.close() ?? Promise.resolve();
    this.#persister = undefined;
    if (this.#ownsLog) this.#log.close?.();
    this.#fail(new MeldStateError("the database is closed", "Closed"));
    this.#node?.free();
    this.#node = undefined;
    this.#watchers.clear();
  }

  /** Resolves once `close()` has finished with the store (at once without one). */
  closed(): Promise<void> {
    return this.#closing;
  }

  /** Same as `close()`. */
  free(): void {
    this.close();
  }

  /** Same as `close()`, for `using`. */
  [disposeSymbol](): void {
    this.close();
  }
}
