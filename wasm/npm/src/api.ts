/** The package's public API, the same on every platform. */
export { MeldDB } from "./db.js";
export type { Settings, MemoryOptions, ConnectOptions, TransactOptions, TransactResult, Change, Commit, NodeStats } from "./db.js";
export { MemoryLog } from "./log.js";
export { MemoryStore } from "./store.js";
export type { NodeStore, SavedNode } from "./store.js";
export { openBrowserStore } from "./browser-store.js";
export type { BrowserStoreOptions } from "./browser-store.js";
export { ServiceLog } from "./remote.js";
export type { ServiceLogOptions, WebSocketLike, WebSocketConstructor } from "./remote.js";
export type { LogClient, EntryListener } from "./log.js";
export { Snapshot, RangeIterator } from "./read.js";
export type { RangeOptions, Entry } from "./read.js";
export { Transaction } from "./transaction.js";
export type { Isolation, Outcome, Committed, Aborted } from "./transaction.js";
export type { Bytes } from "./bytes.js";
export {
  MeldError,
  MeldAbortError,
  MeldArgumentError,
  MeldStorageError,
  MeldConnectionError,
  MeldLogError,
  MeldStateError,
} from "./errors.js";
export type { AbortReason } from "./errors.js";
