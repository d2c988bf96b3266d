/**
 * The logs a node can follow. A log is a totally ordered list of entries;
 * position 0 is the database's genesis record. Appends return the
 * position they got; subscribers receive every entry from a position on,
 * in order.
 */

/** Called with each entry, in log order. */
export type EntryListener = (pos: number, entry: Uint8Array) => void;

/** What a node needs of its log. */
export interface LogClient {
  /** Appends one entry; resolves to its position. */
  append(entry: Uint8Array): Promise<number>;
  /** The position the next append will get (every entry below it exists). */
  tail(): Promise<number>;
  /**
   * Delivers every entry from `from` on, in order, now and as they are
   * appended, until the returned function is called. `onError` hears of
   * a subscription the log ended (e.g. trimmed below `from`).
   */
  subscribe(from: number, listener: EntryListener, onError?: (e: unknown) => void): () => void;
  /** Releases the log's resources (connections); optional. */
  close?(): void;
}

/**
 * A log in this process's memory: several nodes can share one (tests,
 * demos, one tab's nodes). Entries are kept until the object is dropped.
 */
export class MemoryLog implements LogClient {
  readonly #entries: Uint8Array[] = [];
  readonly #subscribers = new Set<() => void>();
  #delivering = false;
  #queued = 0;

  /** Number of entries (the genesis record included). */
  get length(): number {
    return this.#entries.length;
  }

  /** The entry at `pos`, or undefined past the tail. */
  entry(pos: number): Uint8Array | undefined {
    return this.#entries[pos];
  }

  /** Appends synchronously; returns the entry's position. */
  appendNow(entry: Uint8Array): number {
    // The log keeps its own copy: the caller may reuse its buffer.
    this.#entries.push(entry.slice());
    this.#deliver();
    return this.#entries.length - 1;
  }

  append(entry: Uint8Array): Promise<number> {
    return Promise.resolve(this.appendNow(entry));
  }

  tail(): Promise<number> {
    return Promise.resolve(this.#entries.length);
  }

  subscribe(from: number, listener: EntryListener): () => void {
    let next = from;
    const each = (): void => {
      while (next < this.#entries.length) {
        const pos = next++;
        listener(pos, this.#entries[pos] as Uint8Array);
      }
    };
    this.#subscribers.add(each);
    this.#deliver();
    return () => {
      this.#subscribers.delete(each);
    };
  }

  /**
   * Hands new entries to every subscriber. An append made by a listener
   * is delivered by the loop already running, never by a nested one.
   */
  #deliver(): void {
    this.#queued++;
    if (this.#delivering) return;
    this.#delivering = true;
    try {
      while (this.#queued > 0) {
        this.#queued = 0;
        for (const poke of [...this.#subscribers]) poke();
      }
    } finally {
      this.#delivering = false;
    }
  }
}
