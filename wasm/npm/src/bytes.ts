/** Keys and values: bytes, or strings stored as their UTF-8 bytes. */
export type Bytes = Uint8Array | string;

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** The bytes of a key or value (strings as UTF-8). */
export function toBytes(b: Bytes, what: string): Uint8Array {
  if (typeof b === "string") return encoder.encode(b);
  if (b instanceof Uint8Array) return b;
  throw new TypeError(`${what} must be a Uint8Array or a string, not ${typeof b}`);
}

/** UTF-8 bytes as a string; throws `TypeError` if they are not UTF-8. */
export function toText(b: Uint8Array): string {
  return decoder.decode(b);
}

/**
 * The pairs of one range chunk from the wasm module: per pair a u32
 * little-endian key length, the key, a u32 value length, the value.
 */
export function decodePairs(chunk: Uint8Array): Array<[Uint8Array, Uint8Array]> {
  const out: Array<[Uint8Array, Uint8Array]> = [];
  const view = new DataView(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  let at = 0;
  while (at < chunk.length) {
    const kl = view.getUint32(at, true);
    const key = chunk.subarray(at + 4, at + 4 + kl);
    at += 4 + kl;
    const vl = view.getUint32(at, true);
    const value = chunk.subarray(at + 4, at + 4 + vl);
    at += 4 + vl;
    out.push([key, value]);
  }
  return out;
}

/** The smallest key greater than every key starting with `prefix`, or undefined if none is. */
export function prefixEnd(prefix: Uint8Array): Uint8Array | undefined {
  const end = prefix.slice();
  for (let i = end.length - 1; i >= 0; i--) {
    if (end[i] !== 0xff) {
      end[i] = (end[i] as number) + 1;
      return end.subarray(0, i + 1);
    }
  }
  return undefined;
}

/** Whether `key` starts with `prefix`. */
export function hasPrefix(key: Uint8Array, prefix: Uint8Array): boolean {
  if (key.length < prefix.length) return false;
  for (let i = 0; i < prefix.length; i++) if (key[i] !== prefix[i]) return false;
  return true;
}

/** A list of byte strings as one buffer: per item a u32 little-endian length, then the bytes. */
export function encodeList(list: Uint8Array[]): Uint8Array {
  let n = 0;
  for (const b of list) n += 4 + b.length;
  const out = new Uint8Array(n);
  const view = new DataView(out.buffer);
  let at = 0;
  for (const b of list) {
    view.setUint32(at, b.length, true);
    out.set(b, at + 4);
    at += 4 + b.length;
  }
  return out;
}

/**
 * The items of a buffer `encodeList` wrote (the module's checkpoint parts
 * use the same layout), as copies: a view would carry the whole buffer
 * into stores that keep its ArrayBuffer. A torn last item is dropped.
 */
export function decodeList(buf: Uint8Array): Uint8Array[] {
  const out: Uint8Array[] = [];
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  for (let at = 0; at + 4 <= buf.length; ) {
    const n = view.getUint32(at, true);
    if (at + 4 + n > buf.length) break;
    out.push(buf.slice(at + 4, at + 4 + n));
    at += 4 + n;
  }
  return out;
}
