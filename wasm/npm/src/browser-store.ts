/**
 * A node's store in a browser: the origin-private file system (OPFS), or
 * IndexedDB where OPFS cannot write files, held under a Web Lock so that
 * two tabs or workers never share one store.
 *
 * OPFS layout, in directory `melddb/NAME/`: `meta.json` (`{version, log,
 * generation, begin, parts}`), `ckpt-G.bin` (the checkpoint's parts) and
 * `tail-G-FIRST.bin` (entries from position FIRST), each file a list of
 * `u32 LE length, bytes`. A file is written whole and replaced on close
 * (the platform's swap file), and `meta.json` last, so a crash leaves
 * the old generation or the new one. IndexedDB (`melddb-NAME`) keeps the
 * same in one transaction per call.
 */
import { decodeList, encodeList } from "./bytes.js";
import { MeldArgumentError, MeldStorageError } from "./errors.js";
import type { NodeStore, SavedNode } from "./store.js";

/** Options of `openBrowserStore`. */
export interface BrowserStoreOptions {
  /** Force a backend (default: OPFS where it can write files, else IndexedDB). */
  backend?: "opfs" | "indexeddb";
}

const NAME = /^[A-Za-z0-9_.-]{1,64}$/;
/** Tail files after which appends fold them into one. */
const MAX_TAIL_FILES = 32;

/** A storage failure as a typed error: `Quota` when the origin is out of space. */
function storageError(what: string, e: unknown): MeldStorageError {
  if (e instanceof MeldStorageError) return e;
  const name = (e as { name?: unknown } | null)?.name;
  if (name === "QuotaExceededError") {
    return new MeldStorageError(`${what}: the browser's storage quota for this origin is exhausted; free space or clear the store`, "Quota", { cause: e });
  }
  return new MeldStorageError(`${what}: ${String(e)}`, "Failed", { cause: e });
}

/** `b` itself if it spans its whole buffer, else a copy: IndexedDB stores a view's entire buffer. */
function own(b: Uint8Array): Uint8Array {
  return b.byteOffset === 0 && b.byteLength === b.buffer.byteLength ? b : b.slice();
}

interface Meta {
  version: 1;
  log: string;
  generation: number;
  begin: number;
  parts: number;
}

function isMeta(m: unknown): m is Meta {
  const o = m as Partial<Meta> | null;
  return (
    typeof o === "object" &&
    o !== null &&
    o.version === 1 &&
    typeof o.log === "string" &&
    Number.isSafeInteger(o.generation) &&
    Number.isSafeInteger(o.begin) &&
    Number.isSafeInteger(o.parts)
  );
}

/** Joins tail pieces (first position, entries) into one run from `begin`; overlaps are cut, a gap ends it. */
function joinTail(begin: number, pieces: Array<[number, Uint8Array[]]>): Uint8Array[] {
  pieces.sort((a, b) => a[0] - b[0]);
  const tail: Uint8Array[] = [];
  for (const [first, entries] of pieces) {
    const next = begin + tail.length;
    if (first > next) break;
    tail.push(...entries.slice(next - first));
  }
  return tail;
}

class OpfsStore implements NodeStore {
  readonly #dir: FileSystemDirectoryHandle;
  readonly #release: () => void;
  #meta: Meta | undefined;
  #tailFiles = 0;

  constructor(dir: FileSystemDirectoryHandle, release: () => void) {
    this.#dir = dir;
    this.#release = release;
  }

  async #read(name: string): Promise<Uint8Array | undefined> {
    try {
      const f = await (await this.#dir.getFileHandle(name)).getFile();
      return new Uint8Array(await f.arrayBuffer());
    } catch (e) {
      if ((e as { name?: unknown }).name === "NotFoundError") return undefined;
      throw e;
    }
  }

  async #write(name: string, bytes: Uint8Array | string): Promise<void> {
    const w = await (await this.#dir.getFileHandle(name, { create: true })).createWritable();
    try {
      await w.write(bytes as FileSystemWriteChunkType);
      await w.close();
    } catch (e) {
      await w.abort().catch(() => undefined);
      throw e;
    }
  }

  async #names(): Promise<string[]> {
    const names: string[] = [];
    for await (const name of (this.#dir as unknown as { keys(): AsyncIterable<string> }).keys()) names.push(name);
    return names;
  }

  /** Tail files of generation `g`: [first position, file name]. */
  async #tailNames(g: number): Promise<Array<[number, string]>> {
    const prefix = `tail-${g}-`;
    return (await this.#names())
      .filter((n) => n.startsWith(prefix) && n.endsWith(".bin"))
      .map((n): [number, string] => [Number(n.slice(prefix.length, -4)), n])
      .filter(([first]) => Number.isSafeInteger(first));
  }

  async load(): Promise<SavedNode | undefined> {
    try {
      const raw = await this.#read("meta.json");
      if (raw === undefined) return undefined;
      let meta: unknown;
      try {
        meta = JSON.parse(new TextDecoder().decode(raw));
      } catch {
        return undefined;
      }
      if (!isMeta(meta)) return undefined;
      this.#meta = meta;
      const g = meta.generation;
      let checkpoint: SavedNode["checkpoint"];
      if (meta.parts > 0) {
        const parts = decodeList((await this.#read(`ckpt-${g}.bin`)) ?? new Uint8Array(0));
        if (parts.length !== meta.parts) return undefined;
        checkpoint = { begin: meta.begin, parts };
      }
      const pieces: Array<[number, Uint8Array[]]> = [];
      const files = await this.#tailNames(g);
      for (const [first, name] of files) pieces.push([first, decodeList((await this.#read(name)) ?? new Uint8Array(0))]);
      this.#tailFiles = files.length;
      return { log: meta.log, checkpoint, first: meta.begin, tail: joinTail(meta.begin, pieces) };
    } catch (e) {
      throw storageError("reading the node's store (OPFS)", e);
    }
  }

  async reset(log: string, begin: number, parts: Uint8Array[], beginEntry: Uint8Array): Promise<void> {
    try {
      // Past every generation on disk, so that files a crashed reset left
      // behind are never mistaken for this one's.
      let g = (this.#meta?.generation ?? 0) + 1;
      for (const name of await this.#names()) {
        const m = /^(?:ckpt|tail)-(\d+)[-.]/.exec(name);
        if (m !== null) g = Math.max(g, Number(m[1]) + 1);
      }
      if (parts.length > 0) await this.#write(`ckpt-${g}.bin`, encodeList(parts));
      await this.#write(`tail-${g}-${begin}.bin`, encodeList([beginEntry]));
      const meta: Meta = { version: 1, log, generation: g, begin, parts: parts.length };
      await this.#write("meta.json", JSON.stringify(meta));
      this.#meta = meta;
      this.#tailFiles = 1;
      await this.#removeAllBut(g);
    } catch (e) {
      throw storageError("writing a checkpoint to the node's store (OPFS)", e);
    }
  }

  async #removeAllBut(g: number): Promise<void> {
    for (const name of await this.#names()) {
      if (name === "meta.json" || name === `ckpt-${g}.bin` || name.startsWith(`tail-${g}-`)) continue;
      await this.#dir.removeEntry(name).catch(() => undefined);
    }
  }

  async append(first: number, entries: Uint8Array[]): Promise<void> {
    const meta = this.#meta;
    if (meta === undefined) throw new MeldStorageError("an append to a store without a checkpoint or genesis record", "Order");
    try {
      await this.#write(`tail-${meta.generation}-${first}.bin`, encodeList(entries));
      if (++this.#tailFiles > MAX_TAIL_FILES) await this.#fold(meta);
    } catch (e) {
      throw storageError("appending to the node's store (OPFS)", e);
    }
  }

  /** Rewrites the tail as one file (replacing the first), then removes the rest. */
  async #fold(meta: Meta): Promise<void> {
    const files = await this.#tailNames(meta.generation);
    const pieces: Array<[number, Uint8Array[]]> = [];
    for (const [first, name] of files) pieces.push([first, decodeList((await this.#read(name)) ?? new Uint8Array(0))]);
    await this.#write(`tail-${meta.generation}-${meta.begin}.bin`, encodeList(joinTail(meta.begin, pieces)));
    for (const [first, name] of files) if (first !== meta.begin) await this.#dir.removeEntry(name).catch(() => undefined);
    this.#tailFiles = 1;
  }

  async clear(): Promise<void> {
    try {
      for (const name of await this.#names()) await this.#dir.removeEntry(name);
      this.#meta = undefined;
      this.#tailFiles = 0;
    } catch (e) {
      throw storageError("clearing the node's store (OPFS)", e);
    }
  }

  close(): Promise<void> {
    this.#release();
    return Promise.resolve();
  }
}

/** Resolves an IndexedDB request. */
function done<T>(req: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

/** Resolves when a transaction commits. */
function committed(tx: IDBTransaction): Promise<void> {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve();
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error ?? new Error("transaction aborted"));
  });
}

class IndexedDbStore implements NodeStore {
  readonly #db: IDBDatabase;
  readonly #release: () => void;

  constructor(db: IDBDatabase, release: () => void) {
    this.#db = db;
    this.#release = release;
  }

  static async open(name: string, release: () => void): Promise<IndexedDbStore> {
    const req = indexedDB.open(`melddb-${name}`, 1);
    req.onupgradeneeded = () => {
      for (const s of ["meta", "parts", "tail"]) req.result.createObjectStore(s);
    };
    return new IndexedDbStore(await done(req), release);
  }

  async load(): Promise<SavedNode | undefined> {
    try {
      const tx = this.#db.transaction(["meta", "parts", "tail"], "readonly");
      const meta: unknown = await done(tx.objectStore("meta").get("meta"));
      if (!isMeta(meta)) return undefined;
      const parts = (await done(tx.objectStore("parts").getAll())) as Uint8Array[];
      const keys = (await done(tx.objectStore("tail").getAllKeys())) as number[];
      const values = (await done(tx.objectStore("tail").getAll())) as Uint8Array[];
      if (parts.length !== meta.parts) return undefined;
      const pieces = keys.map((k, i): [number, Uint8Array[]] => [k, [values[i] as Uint8Array]]);
      return {
        log: meta.log,
        checkpoint: meta.parts > 0 ? { begin: meta.begin, parts } : undefined,
        first: meta.begin,
        tail: joinTail(meta.begin, pieces),
      };
    } catch (e) {
      throw storageError("reading the node's store (IndexedDB)", e);
    }
  }

  async reset(log: string, begin: number, parts: Uint8Array[], beginEntry: Uint8Array): Promise<void> {
    try {
      const tx = this.#db.transaction(["meta", "parts", "tail"], "readwrite");
      const ps = tx.objectStore("parts");
      const ts = tx.objectStore("tail");
      ps.clear();
      ts.clear();
      parts.forEach((p, i) => ps.put(own(p), i));
      ts.put(own(beginEntry), begin);
      const meta: Meta = { version: 1, log, generation: 0, begin, parts: parts.length };
      tx.objectStore("meta").put(meta, "meta");
      await committed(tx);
    } catch (e) {
      throw storageError("writing a checkpoint to the node's store (IndexedDB)", e);
    }
  }

  async append(first: number, entries: Uint8Array[]): Promise<void> {
    try {
      const tx = this.#db.transaction("tail", "readwrite");
      const ts = tx.objectStore("tail");
      entries.forEach((e, i) => ts.put(own(e), first + i));
      await committed(tx);
    } catch (e) {
      throw storageError("appending to the node's store (IndexedDB)", e);
    }
  }

  async clear(): Promise<void> {
    try {
      const tx = this.#db.transaction(["meta", "parts", "tail"], "readwrite");
      for (const s of ["meta", "parts", "tail"]) tx.objectStore(s).clear();
      await committed(tx);
    } catch (e) {
      throw storageError("clearing the node's store (IndexedDB)", e);
    }
  }

  close(): Promise<void> {
    this.#db.close();
    this.#release();
    return Promise.resolve();
  }
}

/** Whether OPFS here can write files from this context (`createWritable`). */
function opfsWritable(): boolean {
  const storage = (globalThis.navigator as Navigator | undefined)?.storage;
  const handle = (globalThis as { FileSystemFileHandle?: { prototype: object } }).FileSystemFileHandle;
  return typeof storage?.getDirectory === "function" && handle !== undefined && "createWritable" in handle.prototype;
}

/** Takes the Web Lock of store `name`; undefined if another tab or worker holds it. */
async function lock(name: string): Promise<(() => void) | undefined> {
  const locks = (globalThis.navigator as Navigator | undefined)?.locks;
  if (locks === undefined) {
    throw new MeldStorageError("this runtime has no Web Locks (navigator.locks), so a store could be shared by two tabs", "Unsupported");
  }
  return new Promise((resolve, reject) => {
    locks
      .request(`melddb:${name}`, { ifAvailable: true }, (held) => {
        if (held === null) {
          resolve(undefined);
          return undefined;
        }
        // Held until the store is closed (or the tab goes away).
        return new Promise<void>((release) => resolve(release));
      })
      .catch(reject);
  });
}

/**
 * Opens the browser store `name` (1–64 bytes of `A-Z a-z 0-9 _ . -`) for
 * one node, for `MeldDB.connect(url, { store })`. Rejects with
 * `MeldStorageError`: `Locked` if another tab or worker of this origin
 * has it open, `Unsupported` without Web Locks or any storage, `Quota` or
 * `Failed` when storage refuses.
 */
export async function openBrowserStore(name: string, options: BrowserStoreOptions = {}): Promise<NodeStore> {
  if (typeof name !== "string" || !NAME.test(name)) {
    throw new MeldArgumentError(`store name ${JSON.stringify(name)} is not 1-64 bytes of A-Z a-z 0-9 _ . -`, "StoreName");
  }
  const backend = options.backend ?? (opfsWritable() ? "opfs" : "indexeddb");
  if (backend === "opfs" && !opfsWritable()) throw new MeldStorageError("OPFS with writable files is not available here", "Unsupported");
  if (backend === "indexeddb" && typeof indexedDB === "undefined") {
    throw new MeldStorageError("neither OPFS nor IndexedDB is available here", "Unsupported");
  }
  let release: (() => void) | undefined;
  try {
    release = await lock(name);
  } catch (e) {
    throw storageError(`taking the Web Lock of store ${name}`, e);
  }
  if (release === undefined) {
    throw new MeldStorageError(`store ${name} is open in another tab or worker of this origin; close it there or use another name`, "Locked");
  }
  try {
    if (backend === "indexeddb") return await IndexedDbStore.open(name, release);
    const root = await navigator.storage.getDirectory();
    const dir = await (await root.getDirectoryHandle("melddb", { create: true })).getDirectoryHandle(name, { create: true });
    return new OpfsStore(dir, release);
  } catch (e) {
    release();
    throw storageError(`opening store ${name}`, e);
  }
}
