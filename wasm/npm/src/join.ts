/**
 * Joining a log of the service from its latest published checkpoint
 * (`docs/format.md`, "Checkpoint pointers"): read the newest pointers of
 * the companion log `LOG.ckpt`, newest first, fetch the parts one names
 * and load them in the wasm module, which verifies them (the state digest
 * included). A pointer or checkpoint that fails is skipped, never trusted.
 */
import * as raw from "../pkg/melddb_wasm.js";
import { MeldError, call } from "./errors.js";
import type { ServiceLog } from "./remote.js";

/** Pointers looked at, newest first, before giving up on published checkpoints. */
const TRIES = 4;
/** Part reads kept in flight while fetching a checkpoint. */
const READS_AHEAD = 8;

/** A node loaded from a published checkpoint, or why there is none. */
export type Joined = { node: raw.Node; begin: number; parts: Uint8Array[] } | { node: undefined };

/**
 * The newest published checkpoint of `name` that loads, as a node at its
 * begin record, with its parts; none begun at or before `have` (a state
 * the caller already has) is fetched. Why pointers were skipped is added
 * to `skipped`. The parts are returned only with `keepParts`.
 */
export async function fromPublished(log: ServiceLog, name: string, have: number, skipped: string[], keepParts: boolean): Promise<Joined> {
  const companion = `${name}.ckpt`;
  if (companion.length > 64) {
    skipped.push(`${companion} is longer than a log name may be`);
    return { node: undefined };
  }
  let bounds: { first: number; tail: number };
  try {
    bounds = await log.bounds(companion);
  } catch (e) {
    // A token that may read the log but not its companion melds from genesis.
    if (e instanceof MeldError && (e.code === "Forbidden" || e.code === "Unauthorized")) {
      skipped.push(`${companion} is not readable with this token: ${e.message}`);
      return { node: undefined };
    }
    throw e;
  }
  for (let at = bounds.tail - 1; at >= Math.max(bounds.first, bounds.tail - TRIES); at--) {
    const ptr = raw.Published.parse(await log.read(at, companion));
    if (ptr === undefined) {
      skipped.push(`${companion} entry ${at} is not a checkpoint pointer`);
      continue;
    }
    const begin = ptr.begin;
    if (begin <= have) {
      ptr.free();
      break;
    }
    try {
      const parts: Uint8Array[] = [];
      return { node: await load(log, ptr, keepParts ? parts : undefined), begin, parts };
    } catch (e) {
      if (!(e instanceof MeldError) || e.code === "Closed" || e.name === "MeldConnectionError") throw e;
      skipped.push(`checkpoint begun at ${begin}: ${e.message}`);
    } finally {
      ptr.free();
    }
  }
  return { node: undefined };
}

/** Loads the checkpoint `ptr` names; its parts are added to `parts` if given. */
async function load(log: ServiceLog, ptr: raw.Published, parts: Uint8Array[] | undefined): Promise<raw.Node> {
  const positions = ptr.parts;
  const loader = new raw.CheckpointLoader(ptr);
  const reads: Array<Promise<Uint8Array> | undefined> = [];
  const readNext = (): void => {
    const p = log.read(positions[reads.length] as number);
    // Reads left in flight when a part is refused must not go unhandled.
    p.catch(() => undefined);
    reads.push(p);
  };
  try {
    for (let i = 0; i < positions.length; i++) {
      while (reads.length < positions.length && reads.length < i + READS_AHEAD) readNext();
      const part = await (reads[i] as Promise<Uint8Array>);
      reads[i] = undefined;
      call(() => loader.add(part));
      parts?.push(part);
    }
    return call(() => loader.finish());
  } finally {
    loader.free();
  }
}
