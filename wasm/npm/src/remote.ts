/**
 * A log of the log service, over its WebSocket (`GET /v1/ws`): appends in
 * batches with this client's id and consecutive request ids, batch
 * subscriptions, bounds. On a lost connection it reconnects (50 ms
 * doubling to 1 s), says Hello again, resubscribes every subscription
 * from the next position it wants and resends every request in flight
 * unchanged, so a repeated append gets its first position back.
 */
import { MeldArgumentError, MeldConnectionError, MeldError, MeldLogError, MeldStateError, MeldStorageError } from "./errors.js";
import type { EntryListener, LogClient } from "./log.js";
import { CODE_NAMES, FrameReader, FrameWriter, RETRYABLE, T } from "./protocol.js";

/** What this module needs of a WebSocket (the browser's, or the `ws` package's). */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: unknown) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}

/** A WebSocket constructor. */
export type WebSocketConstructor = new (url: string) => WebSocketLike;

let defaultSocket: WebSocketConstructor | undefined;

/** Sets the WebSocket the platform provides (each entry point calls it). */
export function setWebSocket(ctor: WebSocketConstructor | undefined): void {
  defaultSocket = ctor;
}

/** Options of a service log. */
export interface ServiceLogOptions {
  /** The log's name (1–64 bytes of `A-Z a-z 0-9 _ . -`). */
  log: string;
  /** A token of the service's `[tokens]`, sent in Hello. */
  token?: string;
  /** Reconnections a request rides out before it fails (default 8). */
  attempts?: number;
  /** A WebSocket constructor in place of the platform's. */
  WebSocket?: WebSocketConstructor;
}

interface Pending {
  frame: Uint8Array;
  tries: number;
  resolve: (r: FrameReader) => void;
  reject: (e: unknown) => void;
}

interface PendingAppend {
  entry: Uint8Array;
  resolve: (pos: number) => void;
  reject: (e: unknown) => void;
}

interface Subscription {
  next: number;
  listener: EntryListener;
  onError: ((e: unknown) => void) | undefined;
}

const MAX_BACKOFF_MS = 1000;
/**
 * Payload bytes one AppendBatch frame carries at most (more go in the
 * next frame; a longer entry goes alone), far below the service's
 * default frame limit of 64 MiB.
 */
const BATCH_BYTES = 1 << 20;
/** Entries one AppendBatch frame carries at most. */
const BATCH_ENTRIES = 4096;
/** The service's default `max_record_bytes`; a longer entry is refused here. */
const MAX_ENTRY_BYTES = 64 << 20;
const utf8 = new TextEncoder();
const SUB_RECORDS = 4096;
const SUB_BYTES = 4 << 20;
const LOG_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

/** The error a service's Error frame stands for. */
function serviceError(code: number, a: number, b: number, message: string): MeldError {
  const name = CODE_NAMES[code] ?? "BadFrame";
  const text = `log service: ${message} (${name}${a || b ? `, ${a}, ${b}` : ""})`;
  switch (code) {
    case 7:
    case 8:
      return new MeldArgumentError(text, name);
    case 10:
    case 11:
    case 15:
    case 16:
      return new MeldStorageError(text, name);
    case 5:
    case 6:
      return new MeldLogError(text, name);
    default:
      return new MeldConnectionError(text, name);
  }
}

/** The fields of an Error frame (`code u16, a u64, b u64, message str16`), or undefined for a short one. */
function readError(r: FrameReader): { code: number; a: number; b: number; message: string } | undefined {
  try {
    return { code: r.u16(), a: r.u64(), b: r.u64(), message: r.str16() };
  } catch {
    return undefined;
  }
}

/** The WebSocket address of a service: `ws[s]://` as given, `http[s]://` mapped; `/v1/ws` when no path is given. */
export function socketUrl(url: string): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new MeldArgumentError(`not a URL: ${url}`, "Url");
  }
  if (u.protocol === "http:") u.protocol = "ws:";
  else if (u.protocol === "https:") u.protocol = "wss:";
  else if (u.protocol !== "ws:" && u.protocol !== "wss:") {
    throw new MeldArgumentError(`the service URL must be ws:, wss:, http: or https:, not ${u.protocol}`, "Url");
  }
  if (u.pathname === "/" || u.pathname === "") u.pathname = "/v1/ws";
  return u.toString();
}

function randomU64(): bigint {
  const b = new Uint32Array(2);
  globalThis.crypto.getRandomValues(b);
  return (BigInt(b[0] as number) << 32n) | BigInt(b[1] as number);
}

/** A log of the log service. */
export class ServiceLog implements LogClient {
  readonly #url: string;
  readonly #log: string;
  readonly #token: string | undefined;
  readonly #attempts: number;
  readonly #Socket: WebSocketConstructor;
  readonly #client = randomU64();
  #nextRequest = 1n;
  #corr = 1n;
  #ws: WebSocketLike | undefined;
  #ready = false;
  #closed = false;
  #backoff = 50;
  #retry: ReturnType<typeof setTimeout> | undefined;
  /** Resends after a retryable error, cleared on close. */
  readonly #resends = new Set<ReturnType<typeof setTimeout>>();
  readonly #pending = new Map<bigint, Pending>();
  readonly #subs = new Map<bigint, Subscription>();
  #batch: PendingAppend[] = [];

  private constructor(url: string, o: ServiceLogOptions, Socket: WebSocketConstructor) {
    this.#url = url;
    this.#log = o.log;
    this.#token = o.token;
    this.#attempts = o.attempts ?? 8;
    this.#Socket = Socket;
  }

  /** Connects; rejects with `MeldConnectionError` if the service cannot be reached or refuses the token. */
  static async open(url: string, options: ServiceLogOptions): Promise<ServiceLog> {
    if (typeof options.log !== "string" || !LOG_NAME.test(options.log)) {
      throw new MeldArgumentError(`log name ${JSON.stringify(options.log)} is not 1-64 bytes of A-Z a-z 0-9 _ . -`, "BadLogName");
    }
    const attempts = options.attempts ?? 8;
    if (typeof attempts !== "number" || !Number.isInteger(attempts) || attempts < 0) {
      throw new MeldArgumentError(`attempts must be a non-negative integer, not ${String(attempts)}`, "Attempts");
    }
    if (options.token !== undefined && (typeof options.token !== "string" || utf8.encode(options.token).length > 0xffff)) {
      throw new MeldArgumentError("the token must be a string of at most 65535 UTF-8 bytes", "Token");
    }
    const Socket = options.WebSocket ?? defaultSocket;
    if (Socket === undefined) {
      throw new MeldConnectionError("this runtime has no WebSocket; pass one as options.WebSocket", "NoWebSocket");
    }
    const s = new ServiceLog(socketUrl(url), options, Socket);
    await s.#connect(true);
    return s;
  }

  /** Opens a connection; the first one's failure is the caller's error, later ones schedule a retry. */
  #connect(first: boolean): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let settled = false;
      let up = false;
      const fail = (e: unknown): void => {
        if (settled) return;
        settled = true;
        reject(e);
      };
      let ws: WebSocketLike;
      try {
        ws = new this.#Socket(this.#url);
      } catch (e) {
        fail(new MeldConnectionError(`cannot open ${this.#url}: ${String(e)}`, "Connect", { cause: e }));
        return;
      }
      ws.binaryType = "arraybuffer";
      this.#ws = ws;
      ws.onmessage = (ev) => this.#onMessage(ev.data);
      ws.onerror = () => undefined;
      ws.onclose = () => {
        if (this.#ws !== ws) return;
        this.#ready = false;
        this.#ws = undefined;
        // A first connection that never opened is the caller's error; any
        // other loss is ridden out.
        fail(new MeldConnectionError(`cannot connect to ${this.#url} (or it closed the connection)`, "Connect"));
        if (!first || up) this.#lost();
      };
      ws.onopen = () => {
        const hello = this.#token === undefined ? Promise.resolve() : this.#send(T.Hello, (w) => w.str(this.#token as string, 2), true);
        hello.then(
          () => {
            this.#ready = true;
            this.#backoff = 50;
            for (const p of this.#pending.values()) ws.send(p.frame);
            for (const [corr, sub] of [...this.#subs]) this.#resubscribe(corr, sub);
            settled = true;
            up = true;
            resolve();
          },
          (e) => {
            fail(e);
            ws.close();
          },
        );
      };
    });
  }

  /** The connection is gone: count a try against every request, then reconnect after the backoff. */
  #lost(): void {
    if (this.#closed || this.#retry !== undefined) return;
    for (const [corr, p] of this.#pending) {
      if (++p.tries > this.#attempts) {
        this.#pending.delete(corr);
        p.reject(new MeldConnectionError(`lost the log service at ${this.#url} ${this.#attempts} times; the request may or may not have been applied`, "Disconnected"));
      }
    }
    const delay = this.#backoff;
    this.#backoff = Math.min(this.#backoff * 2, MAX_BACKOFF_MS);
    this.#retry = setTimeout(() => {
      this.#retry = undefined;
      if (this.#closed) return;
      this.#connect(false).catch(() => this.#lost());
    }, delay);
  }

  /** Sends a request (now, or when the connection is back); `hello` goes out ahead of the queue. */
  #send(type: number, body: (w: FrameWriter) => void, hello = false): Promise<FrameReader> {
    if (this.#closed) return Promise.reject(new MeldStateError("the service log is closed", "Closed"));
    const corr = this.#corr++;
    const w = new FrameWriter(type, corr);
    body(w);
    const frame = w.done();
    return new Promise((resolve, reject) => {
      if (hello) {
        // Hello is not resent on reconnect (a new one is made).
        this.#pending.set(corr, { frame, tries: this.#attempts, resolve, reject });
        this.#ws?.send(frame);
        return;
      }
      this.#pending.set(corr, { frame, tries: 0, resolve, reject });
      if (this.#ready) this.#ws?.send(frame);
    });
  }

  #onMessage(data: unknown): void {
    if (!(data instanceof ArrayBuffer)) return;
    let r: FrameReader;
    try {
      r = new FrameReader(new Uint8Array(data));
    } catch {
      return;
    }
    const sub = this.#subs.get(r.corr);
    if (sub !== undefined) {
      this.#onSubscription(r.corr, sub, r);
      return;
    }
    if (r.corr === 0n && r.type === T.Error) {
      this.#onConnectionError(r);
      return;
    }
    const p = this.#pending.get(r.corr);
    if (p === undefined) return;
    if (r.type === T.Error) {
      const err = readError(r);
      if (err === undefined) {
        this.#pending.delete(r.corr);
        p.reject(new MeldConnectionError("the log service sent a malformed error frame", "BadFrame"));
        return;
      }
      const corr = r.corr;
      if (RETRYABLE.has(err.code) && ++p.tries <= this.#attempts) {
        const t = setTimeout(() => {
          this.#resends.delete(t);
          if (this.#ready && this.#pending.has(corr)) this.#ws?.send(p.frame);
        }, this.#backoff);
        this.#resends.add(t);
        return;
      }
      this.#pending.delete(corr);
      p.reject(serviceError(err.code, err.a, err.b, err.message));
      return;
    }
    this.#pending.delete(r.corr);
    p.resolve(r);
  }

  /**
   * An error under correlation id 0 comes before the service closes the
   * connection. "Too large" (7, a = length, b = limit) names no request:
   * every request in flight longer than the limit fails with it instead of
   * being resent forever; the rest ride out the reconnection.
   */
  #onConnectionError(r: FrameReader): void {
    const err = readError(r);
    if (err?.code !== 7) return;
    for (const [corr, p] of this.#pending) {
      if (p.frame.length > err.b) {
        this.#pending.delete(corr);
        p.reject(serviceError(err.code, p.frame.length, err.b, err.message));
      }
    }
  }

  #onSubscription(corr: bigint, sub: Subscription, r: FrameReader): void {
    try {
      if (r.type === T.Error) {
        const err = readError(r);
        this.#subs.delete(corr);
        if (err === undefined) throw new MeldConnectionError("the log service sent a malformed error frame", "BadFrame");
        if (RETRYABLE.has(err.code)) {
          this.#resubscribe(corr, sub);
          return;
        }
        sub.onError?.(serviceError(err.code, err.a, err.b, err.message));
        return;
      }
      if (r.type !== T.Entries) return;
      const first = r.u64();
      const count = r.u32();
      for (let i = 0; i < count; i++) {
        const entry = r.bytes(r.u32());
        const pos = first + i;
        // After a resubscription entries before `next` may come again.
        if (pos < sub.next) continue;
        if (pos > sub.next) throw new MeldLogError(`the service skipped from ${sub.next} to ${pos}`, "Gap");
        sub.next++;
        sub.listener(pos, entry);
      }
    } catch (e) {
      this.#subs.delete(corr);
      sub.onError?.(e);
    }
  }

  #resubscribe(old: bigint, sub: Subscription): void {
    this.#subs.delete(old);
    const corr = this.#corr++;
    this.#subs.set(corr, sub);
    const w = new FrameWriter(T.SubscribeBatches, corr).str(this.#log, 1).u64(sub.next).u32(SUB_RECORDS).u32(SUB_BYTES);
    if (this.#ready) this.#ws?.send(w.done());
  }

  append(entry: Uint8Array): Promise<number> {
    if (entry.length > MAX_ENTRY_BYTES) {
      return Promise.reject(
        new MeldArgumentError(`an entry of ${entry.length} bytes is longer than the log service's ${MAX_ENTRY_BYTES}-byte records`, "TooLarge"),
      );
    }
    return new Promise((resolve, reject) => {
      this.#batch.push({ entry: entry.slice(), resolve, reject });
      // Appends made in one turn of the event loop go out as few batches.
      if (this.#batch.length === 1) queueMicrotask(() => this.#flush());
    });
  }

  #flush(): void {
    const all = this.#batch;
    this.#batch = [];
    // Frames stay near `BATCH_BYTES` (an entry longer than that goes alone).
    let start = 0;
    while (start < all.length) {
      let end = start;
      let bytes = 0;
      while (end < all.length && end - start < BATCH_ENTRIES) {
        const n = (all[end] as PendingAppend).entry.length;
        if (end > start && bytes + n > BATCH_BYTES) break;
        bytes += n;
        end++;
      }
      this.#sendBatch(all.slice(start, end));
      start = end;
    }
  }

  #sendBatch(batch: PendingAppend[]): void {
    const first = this.#nextRequest;
    this.#nextRequest += BigInt(batch.length);
    this.#ask(
      T.AppendBatch,
      (w) => {
        w.str(this.#log, 1).u64(this.#client).u64(first).u32(batch.length);
        for (const b of batch) w.u32(b.entry.length).bytes(b.entry);
      },
      T.AppendedBatch,
      (r) => {
        const n = r.u32();
        if (n !== batch.length) throw new MeldConnectionError(`${n} positions for ${batch.length} appends`, "BadFrame");
        return batch.map(() => r.u64());
      },
    ).then(
      (positions) => batch.forEach((b, i) => b.resolve(positions[i] as number)),
      (e: unknown) => batch.forEach((b) => b.reject(e)),
    );
  }

  /** Sends a request and decodes an answer of type `answer`; anything else, or a short frame, is `BadFrame`. */
  async #ask<R>(type: number, body: (w: FrameWriter) => void, answer: number, decode: (r: FrameReader) => R): Promise<R> {
    const r = await this.#send(type, body);
    try {
      if (r.type !== answer) throw new RangeError(`answer type ${r.type}, expected ${answer}`);
      return decode(r);
    } catch (e) {
      if (e instanceof MeldError) throw e;
      throw new MeldConnectionError(`the log service answered request type ${type} with a malformed frame: ${String(e)}`, "BadFrame", { cause: e });
    }
  }

  /**
   * The entry at `pos` of this log, or of `log` (a companion such as
   * `NAME.ckpt`); rejects with `MeldLogError` (`Trimmed`, `NotYetWritten`)
   * if there is none.
   */
  read(pos: number, log: string = this.#log): Promise<Uint8Array> {
    return this.#ask(T.Read, (w) => w.str(log, 1).u64(pos), T.Entry, (r) => {
      if (r.u64() !== pos) throw new RangeError(`an entry for another position than ${pos}`);
      return r.rest().slice();
    });
  }

  /** The first retained position and the tail (the next position to be written) of this log, or of `log`. */
  bounds(log: string = this.#log): Promise<{ first: number; tail: number }> {
    return this.#ask(T.Bounds, (w) => w.str(log, 1), T.Bounds_, (r) => ({ first: r.u64(), tail: r.u64() }));
  }

  async tail(): Promise<number> {
    return (await this.bounds()).tail;
  }

  subscribe(from: number, listener: EntryListener, onError?: (e: unknown) => void): () => void {
    const corr = this.#corr++;
    const sub: Subscription = { next: from, listener, onError };
    this.#resubscribe(corr, sub);
    return () => {
      for (const [c, s] of this.#subs) if (s === sub) this.#subs.delete(c);
    };
  }

  /** Closes the connection; requests in flight reject with `MeldStateError`. */
  close(): void {
    this.#closed = true;
    if (this.#retry !== undefined) clearTimeout(this.#retry);
    this.#retry = undefined;
    for (const t of this.#resends) clearTimeout(t);
    this.#resends.clear();
    const e = new MeldStateError("the service log is closed", "Closed");
    for (const p of this.#pending.values()) p.reject(e);
    this.#pending.clear();
    for (const b of this.#batch) b.reject(e);
    this.#batch = [];
    this.#subs.clear();
    this.#ws?.close();
    this.#ws = undefined;
  }
}
