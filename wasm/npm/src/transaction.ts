/** Read-write transactions and what their commits decide. */
import * as raw from "../pkg/melddb_wasm.js";
import { type Bytes, toBytes, toText } from "./bytes.js";
import { type AbortReason, MeldStateError, call } from "./errors.js";
import { type RangeOptions, RangeIterator, disposeSymbol } from "./read.js";

/** Isolation levels; what each validates is in the package README. */
export type Isolation = "serializable" | "repeatable-read" | "snapshot";

/** The isolation codes of the wasm module. */
export const isolationCode: Record<Isolation, number> = {
  snapshot: 0,
  "repeatable-read": 1,
  serializable: 2,
};

/** A committed transaction (or a read-only one, which logs nothing). */
export interface Committed {
  committed: true;
  /** Its log position (for a read-only transaction: its snapshot's). */
  pos: number;
  /** The CSN of the state it committed (for a read-only one: its snapshot's). */
  csn: number;
  /** Whether it wrote nothing (nothing was appended). */
  readOnly: boolean;
}

/** An aborted transaction: nothing of it is visible anywhere. */
export interface Aborted {
  committed: false;
  /** Its log position. */
  pos: number;
  /** Why it aborted. */
  reason: AbortReason;
  /** The conflicting key, where the reason names one. */
  key: Uint8Array | undefined;
  /** The reason in words. */
  message: string;
}

/** What a commit decided. */
export type Outcome = Committed | Aborted;

/** How a database commits a finished transaction's intention. @internal */
export interface Committer {
  commitIntention(intention: Uint8Array): Promise<Outcome>;
}

/**
 * A transaction on a snapshot of its database: reads see the snapshot and
 * the transaction's own writes; `commit()` appends its intention to the
 * log and resolves with what meld decided. Use `db.transact`, which
 * commits and retries, unless you need to hold several transactions open.
 */
export class Transaction {
  #txn: raw.Txn | undefined;
  readonly #db: Committer;
  readonly #pos: number;
  readonly #csn: number;

  /** @internal */
  constructor(txn: raw.Txn, db: Committer, snapshot: { pos: number; csn: number }) {
    this.#txn = txn;
    this.#db = db;
    this.#pos = snapshot.pos;
    this.#csn = snapshot.csn;
  }

  #live(): raw.Txn {
    if (this.#txn === undefined) {
      throw new MeldStateError("the transaction is finished; begin a new one", "Finished");
    }
    return this.#txn;
  }

  /** The log position of the snapshot it reads. */
  get snapshotPos(): number {
    return this.#pos;
  }

  /** The value of `key`, or undefined. */
  get(key: Bytes): Uint8Array | undefined {
    const k = toBytes(key, "key");
    const t = this.#live();
    return call(() => t.get(k));
  }

  /** The value of `key` as UTF-8 text, or undefined. */
  getString(key: Bytes): string | undefined {
    const v = this.get(key);
    return v === undefined ? undefined : toText(v);
  }

  /** Stores `value` under `key`. */
  put(key: Bytes, value: Bytes): void {
    const k = toBytes(key, "key");
    const v = toBytes(value, "value");
    const t = this.#live();
    call(() => t.put(k, v));
  }

  /** Deletes `key`; whether it was present. */
  delete(key: Bytes): boolean {
    const k = toBytes(key, "key");
    const t = this.#live();
    return call(() => t.delete(k));
  }

  /** The pairs of a range as this transaction sees them (see `RangeOptions`). */
  range(options: RangeOptions = {}): RangeIterator {
    return new RangeIterator(() => this.#live(), options);
  }

  /**
   * Finishes the transaction and commits it: resolves with the outcome
   * (an abort is an outcome here, not an error). A transaction that wrote
   * nothing logs nothing and is committed at once.
   */
  commit(): Promise<Outcome> {
    let intention: Uint8Array | undefined;
    try {
      const t = this.#live();
      intention = call(() => t.finish());
    } catch (e) {
      return Promise.reject(e);
    } finally {
      this.#release();
    }
    if (intention === undefined) {
      return Promise.resolve({ committed: true, pos: this.#pos, csn: this.#csn, readOnly: true });
    }
    return this.#db.commitIntention(intention);
  }

  /** Drops the transaction without committing it. */
  abandon(): void {
    this.#release();
  }

  #release(): void {
    this.#txn?.free();
    this.#txn = undefined;
  }

  /** Same as `abandon()` (a no-op after `commit()`), for `using`. */
  [disposeSymbol](): void {
    this.#release();
  }
}
