/**
 * The errors MeldDB throws. Every one is a `MeldError` with a `name` (its
 * class name) and a machine-readable `code`; catch by class
 * (`err instanceof MeldAbortError`) or by `err.name`.
 */

/** The base class of every MeldDB error. */
export class MeldError extends Error {
  /** What went wrong, as a stable identifier (e.g. `KeyTooLong`). */
  readonly code: string;
  constructor(message: string, code: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/** Why a transaction aborted. */
export type AbortReason =
  | "WriteWrite"
  | "ReadWrite"
  | "Phantom"
  | "SnapshotTooOld"
  | "SnapshotUnavailable"
  | "Malformed";

/**
 * A transaction aborted (after its retries, in `transact`): another
 * transaction committed first and conflicts with it. `key` is the
 * conflicting key where the reason names one.
 */
export class MeldAbortError extends MeldError {
  /** The abort reason. */
  readonly reason: AbortReason;
  /** The conflicting key (a phantom: the start of the range read). */
  readonly key: Uint8Array | undefined;
  /** The log position of the aborted intention. */
  readonly pos: number;
  constructor(message: string, reason: AbortReason, key: Uint8Array | undefined, pos: number) {
    super(message, reason);
    this.reason = reason;
    this.key = key;
    this.pos = pos;
  }
}

/** An argument is out of range: a key or value too long, a bad option. */
export class MeldArgumentError extends MeldError {}

/** A state could not be read or stored (storage failure, quota). */
export class MeldStorageError extends MeldError {}

/** The log is unreachable or refused the connection. */
export class MeldConnectionError extends MeldError {}

/** The log holds something this node cannot follow (e.g. a bad genesis record). */
export class MeldLogError extends MeldError {}

/** An object was used after it was finished, closed or freed. */
export class MeldStateError extends MeldError {}

const byName: Record<string, new (message: string, code: string) => MeldError> = {
  MeldArgumentError,
  MeldStorageError,
  MeldConnectionError,
  MeldLogError,
  MeldStateError,
};

/** Turns an error thrown by the wasm module into its `MeldError` subclass. */
export function fromWasm(e: unknown): unknown {
  if (e instanceof Error && !(e instanceof MeldError)) {
    const Class = byName[e.name];
    if (Class !== undefined) {
      const code = (e as { code?: unknown }).code;
      return new Class(e.message, typeof code === "string" ? code : e.name);
    }
  }
  return e;
}

/** Runs `f`, rethrowing wasm errors as `MeldError` subclasses. */
export function call<T>(f: () => T): T {
  try {
    return f();
  } catch (e) {
    throw fromWasm(e);
  }
}
