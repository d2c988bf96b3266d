/**
 * The log service's binary protocol, version 1 (`docs/log-service.md`,
 * "Protocol"): over WebSocket each binary message is one frame,
 * `version u8, type u8, corr u64, fields`, integers little-endian.
 */

/** Request and response type numbers. */
export const T = {
  Hello: 1,
  Read: 3,
  Bounds: 4,
  AppendBatch: 8,
  SubscribeBatches: 10,
  HelloOk: 101,
  Entry: 103,
  Bounds_: 104,
  AppendedBatch: 108,
  Entries: 109,
  Error: 200,
} as const;

/** Error codes of the service whose request may be sent again as is. */
export const RETRYABLE = new Set([9, 12, 13]);

/** The service's error codes by number, as names for `MeldError.code`. */
export const CODE_NAMES: Record<number, string> = {
  1: "BadFrame",
  2: "Version",
  3: "Unauthorized",
  4: "Forbidden",
  5: "NotYetWritten",
  6: "Trimmed",
  7: "TooLarge",
  8: "BadLogName",
  9: "WriteFailed",
  10: "LogFull",
  11: "Unrecoverable",
  12: "ShuttingDown",
  13: "Busy",
  14: "TrimBeyondTail",
  15: "NoSpace",
  16: "Exhausted",
};

const utf8 = new TextEncoder();

/** Builds one frame. */
export class FrameWriter {
  #buf = new Uint8Array(64);
  #view = new DataView(this.#buf.buffer);
  #len = 0;

  constructor(type: number, corr: bigint) {
    this.u8(1).u8(type).u64(corr);
  }

  #room(n: number): void {
    if (this.#len + n <= this.#buf.length) return;
    let size = this.#buf.length * 2;
    while (size < this.#len + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.#buf.subarray(0, this.#len));
    this.#buf = next;
    this.#view = new DataView(next.buffer);
  }

  u8(v: number): this {
    this.#room(1);
    this.#view.setUint8(this.#len, v);
    this.#len += 1;
    return this;
  }

  u16(v: number): this {
    this.#room(2);
    this.#view.setUint16(this.#len, v, true);
    this.#len += 2;
    return this;
  }

  u32(v: number): this {
    this.#room(4);
    this.#view.setUint32(this.#len, v, true);
    this.#len += 4;
    return this;
  }

  u64(v: bigint | number): this {
    this.#room(8);
    this.#view.setBigUint64(this.#len, BigInt(v), true);
    this.#len += 8;
    return this;
  }

  bytes(b: Uint8Array): this {
    this.#room(b.length);
    this.#buf.set(b, this.#len);
    this.#len += b.length;
    return this;
  }

  /** A string with a u8 (`str8`) or u16 (`str16`) length. */
  str(s: string, lenBytes: 1 | 2): this {
    const b = utf8.encode(s);
    if (b.length >= 1 << (8 * lenBytes)) throw new RangeError(`a string of ${b.length} bytes does not fit str${8 * lenBytes}`);
    return (lenBytes === 1 ? this.u8(b.length) : this.u16(b.length)).bytes(b);
  }

  done(): Uint8Array {
    return this.#buf.slice(0, this.#len);
  }
}

/** Reads one frame; a short frame throws `RangeError`. */
export class FrameReader {
  readonly #b: Uint8Array;
  readonly #view: DataView;
  #at = 0;
  readonly type: number;
  readonly corr: bigint;

  constructor(frame: Uint8Array) {
    this.#b = frame;
    this.#view = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
    const version = this.u8();
    if (version !== 1) throw new RangeError(`protocol version ${version}, expected 1`);
    this.type = this.u8();
    this.corr = this.#view.getBigUint64(this.#advance(8), true);
  }

  #advance(n: number): number {
    const at = this.#at;
    if (at + n > this.#b.length) throw new RangeError("frame too short");
    this.#at += n;
    return at;
  }

  u8(): number {
    return this.#view.getUint8(this.#advance(1));
  }

  u16(): number {
    return this.#view.getUint16(this.#advance(2), true);
  }

  u32(): number {
    return this.#view.getUint32(this.#advance(4), true);
  }

  /** A u64 as a number (positions stay far below 2^53). */
  u64(): number {
    return Number(this.#view.getBigUint64(this.#advance(8), true));
  }

  /** The bytes not read yet. */
  rest(): Uint8Array {
    return this.bytes(this.#b.length - this.#at);
  }

  bytes(n: number): Uint8Array {
    const at = this.#advance(n);
    return this.#b.subarray(at, at + n);
  }

  str16(): string {
    return new TextDecoder().decode(this.bytes(this.u16()));
  }
}
