/**
 * Reading: snapshots, transactions and their range iterators. Every call
 * into the wasm module is synchronous; a range is fetched in chunks, each
 * one call, and continues after the last key of the chunk before.
 */
import * as raw from "../pkg/melddb_wasm.js";
import { type Bytes, decodePairs, prefixEnd, toBytes, toText } from "./bytes.js";
import { MeldArgumentError, MeldStateError, call } from "./errors.js";

/** Bounds, direction and length of a range. */
export interface RangeOptions {
  /** Keys greater than or equal to this. */
  gte?: Bytes;
  /** Keys greater than this. */
  gt?: Bytes;
  /** Keys less than or equal to this. */
  lte?: Bytes;
  /** Keys less than this. */
  lt?: Bytes;
  /** Keys starting with this (combines with the bounds above). */
  prefix?: Bytes;
  /** Descending key order. */
  reverse?: boolean;
  /** At most this many pairs. */
  limit?: number;
}

/** One key and its value. */
export type Entry = [key: Uint8Array, value: Uint8Array];

/** What a range reads from: a transaction or a snapshot. */
interface RangeSource {
  range(sk: number, s: Uint8Array, ek: number, e: Uint8Array, reverse: boolean, limit: number): Uint8Array;
}

/** Pairs in a range's first chunk; each next chunk doubles, up to `MAX_CHUNK`. */
const FIRST_CHUNK = 16;
const MAX_CHUNK = 256;
const EMPTY = new Uint8Array(0);

/** A bound as the wasm module takes it: [kind, key] with 0 open, 1 inclusive, 2 exclusive. */
type Bound = [number, Uint8Array];

function cmp(a: Uint8Array, b: Uint8Array): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const d = (a[i] as number) - (b[i] as number);
    if (d !== 0) return d;
  }
  return a.length - b.length;
}

/** The tighter of two lower (or, with `upper`, upper) bounds. */
function tighter(a: Bound, b: Bound, upper: boolean): Bound {
  if (a[0] === 0) return b;
  if (b[0] === 0) return a;
  const c = cmp(a[1], b[1]);
  if (c === 0) return a[0] === 2 ? a : b;
  return (c > 0) !== upper ? a : b;
}

function bounds(o: RangeOptions): { start: Bound; end: Bound; limit: number; reverse: boolean } {
  if (o.gte !== undefined && o.gt !== undefined) throw new MeldArgumentError("give gte or gt, not both", "Bound");
  if (o.lte !== undefined && o.lt !== undefined) throw new MeldArgumentError("give lte or lt, not both", "Bound");
  let start: Bound = o.gte !== undefined ? [1, toBytes(o.gte, "gte")] : o.gt !== undefined ? [2, toBytes(o.gt, "gt")] : [0, EMPTY];
  let end: Bound = o.lte !== undefined ? [1, toBytes(o.lte, "lte")] : o.lt !== undefined ? [2, toBytes(o.lt, "lt")] : [0, EMPTY];
  if (o.prefix !== undefined) {
    const p = toBytes(o.prefix, "prefix");
    start = tighter(start, [1, p], false);
    const pe = prefixEnd(p);
    if (pe !== undefined) end = tighter(end, [2, pe], true);
  }
  const limit = o.limit ?? Infinity;
  if (!(limit >= 0) || (limit !== Infinity && !Number.isInteger(limit))) {
    throw new MeldArgumentError(`limit must be a non-negative integer, not ${String(o.limit)}`, "Limit");
  }
  return { start, end, limit, reverse: o.reverse === true };
}

/**
 * The pairs of a range, in key order (or reversed), fetched lazily in
 * chunks. Iterate it once, with `for await` or plain `for` (each chunk is
 * one synchronous call), or take `toArray()`. Under serializable isolation a
 * transaction's range protects what it has fetched against phantoms: all
 * of the range once the iteration ended by itself; when stopped early, up
 * to the last pair of the last chunk fetched (chunks hold 16 pairs at
 * first, doubling to 256), which may be a little past the last pair read.
 */
export class RangeIterator implements AsyncIterable<Entry>, Iterable<Entry> {
  readonly #src: () => RangeSource;
  #start: Bound;
  #end: Bound;
  readonly #reverse: boolean;
  #left: number;
  #buffer: Entry[] = [];
  #at = 0;
  #done = false;
  #chunk = FIRST_CHUNK;

  /** @internal */
  constructor(src: () => RangeSource, options: RangeOptions) {
    const b = bounds(options);
    this.#src = src;
    this.#start = b.start;
    this.#end = b.end;
    this.#reverse = b.reverse;
    this.#left = b.limit;
    this.#done = b.limit === 0;
  }

  #fill(): void {
    const want = Math.min(this.#chunk, this.#left);
    this.#chunk = Math.min(this.#chunk * 2, MAX_CHUNK);
    const [sk, s] = this.#start;
    const [ek, e] = this.#end;
    const src = this.#src();
    const chunk = call(() => src.range(sk, s, ek, e, this.#reverse, want));
    this.#buffer = decodePairs(chunk);
    this.#at = 0;
    this.#left -= this.#buffer.length;
    const last = this.#buffer[this.#buffer.length - 1];
    if (this.#buffer.length < want || this.#left === 0 || last === undefined) {
      this.#done = true;
    } else if (this.#reverse) {
      this.#end = [2, last[0]];
    } else {
      this.#start = [2, last[0]];
    }
  }

  #next(): IteratorResult<Entry> {
    if (this.#at >= this.#buffer.length) {
      if (this.#done) return { done: true, value: undefined };
      this.#fill();
      if (this.#at >= this.#buffer.length) return { done: true, value: undefined };
    }
    return { done: false, value: this.#buffer[this.#at++] as Entry };
  }

  /** Every remaining pair, as an array. */
  toArray(): Entry[] {
    const out: Entry[] = [];
    for (let r = this.#next(); r.done !== true; r = this.#next()) out.push(r.value);
    return out;
  }

  [Symbol.iterator](): IterableIterator<Entry> {
    return { next: () => this.#next(), [Symbol.iterator]() { return this; } };
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<Entry> {
    return {
      next: () => Promise.resolve(this.#next()),
      [Symbol.asyncIterator]() {
        return this;
      },
    };
  }
}

const disposeSymbol: symbol = (Symbol as { dispose?: symbol }).dispose ?? Symbol.for("Symbol.dispose");

/** An immutable committed state: its reads never change and never abort. */
export class Snapshot {
  #snap: raw.Snap | undefined;

  /** @internal */
  constructor(snap: raw.Snap) {
    this.#snap = snap;
  }

  #live(): raw.Snap {
    if (this.#snap === undefined) throw new MeldStateError("the snapshot was freed", "Freed");
    return this.#snap;
  }

  /** The log position of this state. */
  get pos(): number {
    return this.#live().pos;
  }

  /** Its commit sequence number. */
  get csn(): number {
    return this.#live().csn;
  }

  /** The value of `key`, or undefined. */
  get(key: Bytes): Uint8Array | undefined {
    const k = toBytes(key, "key");
    const s = this.#live();
    return call(() => s.get(k));
  }

  /** The value of `key` as UTF-8 text, or undefined. */
  getString(key: Bytes): string | undefined {
    const v = this.get(key);
    return v === undefined ? undefined : toText(v);
  }

  /** The pairs of a range (see `RangeOptions`). */
  range(options: RangeOptions = {}): RangeIterator {
    return new RangeIterator(() => this.#live(), options);
  }

  /** The state digest in hex: equal on every node at this position. */
  digest(): string {
    const s = this.#live();
    return call(() => s.digest());
  }

  /** Releases the snapshot's memory now (it is also released when collected). */
  free(): void {
    this.#snap?.free();
    this.#snap = undefined;
  }

  /** Same as `free()`, for `using`. */
  [disposeSymbol](): void {
    this.free();
  }
}

/** Exported for the transaction, which extends these reads with writes. */
export { disposeSymbol };
