import { MeldStorageError } from "./errors.js";

/**
 * Where a node keeps what it has melded, so that it resumes there after a
 * restart or a reload instead of melding the log again: one checkpoint
 * (the state at a checkpoint begin record, as parts) and the log entries
 * melded after it. A node replays the saved entries, checks that its last
 * one is still the log's, and catches up from the log.
 */

/** What a store holds. */
export interface SavedNode {
  /** The log it was melded from (its name on the service). */
  log: string;
  /** The checkpoint the tail starts from: its begin position and parts (none: the tail starts at the genesis record). */
  checkpoint: { begin: number; parts: Uint8Array[] } | undefined;
  /** Position of `tail[0]`: the checkpoint's begin record, or 0 (the genesis record). */
  first: number;
  /** The log entries from `first` on, as melded. */
  tail: Uint8Array[];
}

/**
 * A node's persistent store. Calls never overlap (the node waits for each
 * before the next). Failures reject with `MeldStorageError`.
 */
export interface NodeStore {
  /** What was saved, or undefined for an empty store. */
  load(): Promise<SavedNode | undefined>;
  /**
   * Replaces everything with a checkpoint of `log` begun at `begin` and a
   * tail holding only `beginEntry` (the entry at `begin`); with
   * `parts` empty, a tail from the genesis record `beginEntry` (begin 0).
   * Atomic: after a crash the store holds the old contents or the new.
   */
  reset(log: string, begin: number, parts: Uint8Array[], beginEntry: Uint8Array): Promise<void>;
  /** Adds entries to the tail; `first` is the position of `entries[0]`, the one after the tail's last. */
  append(first: number, entries: Uint8Array[]): Promise<void>;
  /** Empties the store. */
  clear(): Promise<void>;
  /** Releases the store (and its lock); the object is unusable afterwards. */
  close(): Promise<void>;
}

/** A store in this process's memory (tests; nodes that restart in-process). */
export class MemoryStore implements NodeStore {
  #saved: SavedNode | undefined;

  load(): Promise<SavedNode | undefined> {
    const s = this.#saved;
    if (s === undefined) return Promise.resolve(undefined);
    return Promise.resolve({
      log: s.log,
      checkpoint: s.checkpoint && { begin: s.checkpoint.begin, parts: [...s.checkpoint.parts] },
      first: s.first,
      tail: [...s.tail],
    });
  }

  reset(log: string, begin: number, parts: Uint8Array[], beginEntry: Uint8Array): Promise<void> {
    this.#saved = {
      log,
      checkpoint: parts.length > 0 ? { begin, parts: parts.map((p) => p.slice()) } : undefined,
      first: begin,
      tail: [beginEntry.slice()],
    };
    return Promise.resolve();
  }

  append(first: number, entries: Uint8Array[]): Promise<void> {
    const s = this.#saved;
    if (s === undefined || first !== s.first + s.tail.length) {
      return Promise.reject(new MeldStorageError(`an append at ${first} does not follow the saved tail`, "Order"));
    }
    for (const e of entries) s.tail.push(e.slice());
    return Promise.resolve();
  }

  clear(): Promise<void> {
    this.#saved = undefined;
    return Promise.resolve();
  }

  close(): Promise<void> {
    return Promise.resolve();
  }

  /** Entries in the tail (for tests and progress reports). */
  get tailLength(): number {
    return this.#saved?.tail.length ?? 0;
  }
}
