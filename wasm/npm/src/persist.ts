/**
 * A node's persistence: restoring it from its store when it connects, and
 * saving what it melds as it goes (`store.ts` holds the format's model).
 * Every store call runs after the one before, on one promise chain; a
 * store failure stops persisting (the node goes on in memory) and is
 * reported, never thrown into a meld.
 */
import * as raw from "../pkg/melddb_wasm.js";
import { decodeList } from "./bytes.js";
import { MeldError, MeldStorageError, call } from "./errors.js";
import type { ServiceLog } from "./remote.js";
import type { NodeStore, SavedNode } from "./store.js";

/** Body bytes per part of a checkpoint this node saves. */
const PART_BYTES = 1 << 20;

/** A node rebuilt from its store. */
export interface Restored {
  node: raw.Node;
  /** Position of the saved checkpoint's begin record (0: the genesis record). */
  begin: number;
  /** Saved entries melded again. */
  restored: number;
  /** Position of the last entry melded. */
  last: number;
  /** Bytes of the saved entries after the checkpoint. */
  tailBytes: number;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}


/** Runs a store call; anything it throws becomes a `MeldStorageError`. */
export async function storeCall<T>(what: string, op: () => Promise<T>): Promise<T> {
  try {
    return await op();
  } catch (e) {
    if (e instanceof MeldStorageError) throw e;
    throw new MeldStorageError(`${what}: ${String(e)}`, "Failed", { cause: e });
  }
}

/** The node a store's contents stand for: its checkpoint, with its tail melded again. */
function rebuild(saved: SavedNode): raw.Node {
  let node: raw.Node;
  if (saved.checkpoint !== undefined) {
    const { begin, parts } = saved.checkpoint;
    const loader = call(() => raw.CheckpointLoader.saved(begin, parts.length));
    try {
      for (const p of parts) call(() => loader.add(p));
      node = call(() => loader.finish());
    } finally {
      loader.free();
    }
  } else {
    node = call(() => new raw.Node(saved.tail[0] as Uint8Array));
  }
  try {
    for (let i = 1; i < saved.tail.length; i++) {
      for (const d of call(() => node.apply(saved.tail[i] as Uint8Array))) d.free();
    }
  } catch (e) {
    node.free();
    throw e;
  }
  return node;
}

/**
 * Rebuilds the node `store` holds for log `name`, if any, and checks that
 * the last entry it melded is still the log's at that position (so the
 * store belongs to this log and the log goes on from there). A store of
 * another log, one the log no longer matches or that does not load is
 * emptied; `skipped` says why.
 */
export async function restore(store: NodeStore, log: ServiceLog, name: string, skipped: string[]): Promise<Restored | undefined> {
  const saved = await storeCall("reading the node's store", () => store.load());
  if (saved === undefined) return undefined;
  const giveUp = async (why: string): Promise<undefined> => {
    skipped.push(`the store: ${why}`);
    await storeCall("emptying the node's store", () => store.clear());
    return undefined;
  };
  if (typeof saved !== "object" || saved === null || !Array.isArray(saved.tail) || !Number.isSafeInteger(saved.first)) {
    return giveUp("it returned something other than a saved node");
  }
  if (saved.log !== name) return giveUp(`it holds log ${String(saved.log)}`);
  const lastEntry = saved.tail[saved.tail.length - 1];
  if (lastEntry === undefined) return giveUp("its tail is empty");
  // The tail starts at the checkpoint's begin record, or at the genesis record.
  if (saved.checkpoint === undefined ? saved.first !== 0 : saved.checkpoint.begin !== saved.first) {
    return giveUp(`its tail starts at ${saved.first}, not at its checkpoint's begin record`);
  }
  const last = saved.first + saved.tail.length - 1;
  const bounds = await log.bounds();
  if (bounds.first > last || bounds.tail <= last) {
    return giveUp(`the log holds positions ${bounds.first} to ${bounds.tail - 1}, not its last entry ${last}`);
  }
  if (!sameBytes(await log.read(last), lastEntry)) return giveUp(`its entry ${last} is not the log's`);
  try {
    const tailBytes = saved.tail.reduce((n, e, i) => (i === 0 ? n : n + e.length), 0);
    return { node: rebuild(saved), begin: saved.first, restored: saved.tail.length - 1, last, tailBytes };
  } catch (e) {
    if (!(e instanceof MeldError)) throw e;
    return giveUp(`it does not load: ${e.message}`);
  }
}

/** Saves what a node melds into its store. */
export class Persister {
  readonly #store: NodeStore;
  readonly #log: string;
  readonly #checkpointBytes: number;
  readonly #onError: (e: MeldStorageError) => void;
  #chain: Promise<void> = Promise.resolve();
  /** Entries melded and not yet handed to the store, from position `#first`. */
  #buffer: Uint8Array[] = [];
  #first = 0;
  #flushing = false;
  /** Log bytes melded since the saved checkpoint, and since the last begin record. */
  #sinceCheckpoint = 0;
  #sinceBegin = 0;
  /** Log bytes without a begin record after which this node appends one. */
  readonly #beginEvery: number;
  #askedBegin = false;
  #mayNotAppend = false;
  #started = false;
  #failed: MeldStorageError | undefined;
  #closed = false;

  constructor(store: NodeStore, log: string, checkpointBytes: number, onError: (e: MeldStorageError) => void) {
    this.#store = store;
    this.#log = log;
    this.#checkpointBytes = checkpointBytes;
    this.#onError = onError;
    // Two to three times the checkpoint interval, drawn per node, so that
    // nodes do not all append a begin record at once (as native nodes do).
    this.#beginEvery = checkpointBytes * (2 + Math.random());
  }

  /** The first store failure, if persisting stopped. */
  get failed(): MeldStorageError | undefined {
    return this.#failed;
  }

  /** The node was restored from the store up to `last`: new entries follow it. */
  resumed(last: number, tailBytes: number): void {
    this.#started = true;
    this.#first = last + 1;
    // The saved tail counts toward the next checkpoint, so a node that
    // melds little per session still checkpoints eventually.
    this.#sinceCheckpoint = tailBytes;
    this.#sinceBegin = tailBytes;
  }

  /** The node starts from a checkpoint of the log (`parts`, begun at `begin`, whose record is `beginEntry`): the store is replaced by it. */
  startAt(begin: number, parts: Uint8Array[], beginEntry: Uint8Array): void {
    this.#started = true;
    this.#first = begin + 1;
    this.#enqueue(() => this.#store.reset(this.#log, begin, parts, beginEntry));
  }

  /** Records the entry at `pos` that `node` has just melded. */
  melded(pos: number, entry: Uint8Array, node: raw.Node): void {
    if (this.#failed !== undefined || this.#closed) return;
    if (!this.#started) {
      // The genesis record: the store starts from it.
      this.startAt(0, [], entry.slice());
      return;
    }
    const isBegin = node.lastBegin() === pos;
    if (isBegin) {
      this.#sinceBegin = 0;
      this.#askedBegin = false;
      if (this.#sinceCheckpoint >= this.#checkpointBytes) {
        let parts: Uint8Array[];
        try {
          parts = decodeList(call(() => node.checkpoint(PART_BYTES)));
        } catch (e) {
          this.#fail(e);
          return;
        }
        // The checkpoint supersedes every entry before it.
        this.#buffer = [];
        this.#first = pos + 1;
        this.#sinceCheckpoint = 0;
        const record = entry.slice();
        this.#enqueue(() => this.#store.reset(this.#log, pos, parts, record));
        return;
      }
    } else {
      this.#sinceBegin += entry.length;
    }
    this.#sinceCheckpoint += entry.length;
    this.#buffer.push(entry.slice());
    if (!this.#flushing) {
      this.#flushing = true;
      // Entries melded in one turn of the event loop go to the store together.
      setTimeout(() => {
        this.#flushing = false;
        this.#flushBuffer();
      }, 0);
    }
  }

  /** Whether the node should append a begin record: none came for a while, so its store cannot checkpoint. */
  wantsBegin(): boolean {
    if (this.#failed !== undefined || this.#askedBegin || this.#mayNotAppend || this.#sinceBegin < this.#beginEvery) return false;
    this.#askedBegin = true;
    return true;
  }

  /** The begin record's append failed: ask again after as much log again, or never if the token may not append. */
  beginFailed(e: unknown): void {
    this.#askedBegin = false;
    this.#sinceBegin = 0;
    if (e instanceof MeldError && (e.code === "Forbidden" || e.code === "Unauthorized")) this.#mayNotAppend = true;
  }

  #flushBuffer(): void {
    if (this.#buffer.length === 0) return;
    const first = this.#first;
    const entries = this.#buffer;
    this.#buffer = [];
    this.#first += entries.length;
    this.#enqueue(() => this.#store.append(first, entries));
  }

  #enqueue(op: () => Promise<void>): void {
    this.#chain = this.#chain.then(async () => {
      if (this.#failed !== undefined) return;
      try {
        await op();
      } catch (e) {
        this.#fail(e);
      }
    });
  }

  #fail(e: unknown): void {
    if (this.#failed !== undefined) return;
    this.#failed =
      e instanceof MeldStorageError ? e : new MeldStorageError(`the node's store failed: ${String(e)}; the node goes on without it`, "Failed", { cause: e });
    try {
      this.#onError(this.#failed);
    } catch {
      // A throwing callback must not stop the node or the store chain.
    }
  }

  /** Resolves once everything melded so far is in the store (rejects with the store's failure). */
  async flush(): Promise<void> {
    this.#flushBuffer();
    await this.#chain;
    if (this.#failed !== undefined) throw this.#failed;
  }

  /** Saves what is buffered, then closes the store. */
  close(): Promise<void> {
    if (this.#closed) return this.#chain;
    this.#flushBuffer();
    this.#closed = true;
    this.#chain = this.#chain.then(() => this.#store.close()).catch((e: unknown) => this.#fail(e));
    return this.#chain;
  }
}
