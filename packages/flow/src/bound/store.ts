import {
  closeSync,
  fstatSync,
  fsyncSync,
  ftruncateSync,
  lstatSync,
  mkdirSync,
  openSync,
  readFileSync,
  writeSync,
} from "node:fs";
import { dirname, join } from "node:path";
import { lockHolder } from "../run/locks.js";
import { runPaths } from "../run/paths.js";
import { asError, BoundError } from "./errors.js";
import {
  type BoundLine,
  type ClosedLine,
  type HelperPair,
  type HelperRole,
  type OrchestratorLine,
  samePairs,
  serializeLine,
  validateLine,
} from "./line.js";
import { withDirLock } from "./lock.js";

/**
 * The flow-bound directory, `<state>/flow-bound/`:
 *
 *   <owner>.jsonl            the owner thread's orchestrator and closed lines (its binding files)
 *   decisions/<owner>.jsonl  the spawn hook's ledger (decisions.ts)
 *   claims/                  the hook's claims (left out of the shared digest with the ledger)
 *   .lock                    the directory lock (lock.ts)
 *
 * Made 0700 and written 0600: a directory or file that is a link, not the user's, or writable by group or
 * others cannot be trusted, and reads as no binding (never a refusal of a spawn).
 */
export const BOUND_DIR = "flow-bound";
const OWNER_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export function boundDir(state: string): string {
  return join(state, BOUND_DIR);
}

export function checkOwnerId(owner: string): string {
  if (!OWNER_ID.test(owner) || owner.includes(".."))
    throw new BoundError(
      "unwritable",
      `owner thread id '${owner}' is not valid (letters, digits, '.', '_', '-')`,
    );
  return owner;
}

export function bindingFile(state: string, owner: string): string {
  return join(boundDir(state), `${checkOwnerId(owner)}.jsonl`);
}

/** Throws `untrusted` unless `path` is the user's own directory or file, not a link, not group/other-writable. */
export function checkTrusted(path: string, kind: "dir" | "file"): void {
  const st = lstatSync(path);
  if (st.isSymbolicLink()) throw new BoundError("untrusted", `${path} is a symbolic link`);
  if (kind === "dir" ? !st.isDirectory() : !st.isFile())
    throw new BoundError("untrusted", `${path} is not a ${kind === "dir" ? "directory" : "regular file"}`);
  const uid = process.getuid?.();
  if (uid !== undefined && st.uid !== uid)
    throw new BoundError("untrusted", `${path} belongs to uid ${st.uid}, not to this user (${uid})`);
  if ((st.mode & 0o022) !== 0)
    throw new BoundError(
      "untrusted",
      `${path} is writable by group or others (mode ${(st.mode & 0o777).toString(8)})`,
    );
}

export interface BoundFileRead {
  lines: BoundLine[];
  /** A last line without its newline (a write cut short): ignored, reported. */
  torn: boolean;
  /** The byte length of the complete lines (where an append starts when the tail is torn). */
  completeBytes: number;
  /** The last complete line when it is no valid line (refused on read: no binding). */
  invalidLast: string | null;
}

/** Parses a flow-bound file's text: a torn last line is ignored, a bad line before the last is an error. */
export function parseBoundFile(text: string, where = "flow-bound file"): BoundFileRead {
  const end = text.lastIndexOf("\n") + 1;
  const torn = end < text.length;
  const raw = text.slice(0, end).split("\n").slice(0, -1);
  const lines: BoundLine[] = [];
  let invalidLast: string | null = null;
  raw.forEach((textLine, i) => {
    if (textLine.trim() === "") return;
    try {
      lines.push(validateLine(JSON.parse(textLine)));
    } catch (e) {
      const message = e instanceof BoundError ? e.message : "not JSON";
      if (i === raw.length - 1) invalidLast = message;
      else
        throw new BoundError("file_corrupt", `${where}: line ${i + 1} is bad: ${message}`, { line: i + 1 });
    }
  });
  return { lines, torn, completeBytes: Buffer.byteLength(text.slice(0, end)), invalidLast };
}

export interface BindingRead {
  /** The owner's binding: its last line when that is an orchestrator line, else null. */
  line: OrchestratorLine | null;
  last: BoundLine | null;
  /** Why the binding reads as none although there may be one (untrusted, corrupt, invalid last line). */
  warning: string | null;
}

/** The owner thread's binding as the spawn hook and `crw flow next` read it. Never throws. */
export function readBinding(state: string, owner: string): BindingRead {
  let file: string;
  try {
    file = bindingFile(state, owner);
  } catch (e) {
    return { line: null, last: null, warning: asError(e).message };
  }
  let text: string;
  try {
    checkTrusted(dirname(file), "dir");
    checkTrusted(file, "file");
    text = readFileSync(file, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return { line: null, last: null, warning: null };
    return { line: null, last: null, warning: `binding of ${owner} read as none: ${asError(e).message}` };
  }
  try {
    const read = parseBoundFile(text, file);
    if (read.invalidLast !== null)
      return { line: null, last: null, warning: `binding of ${owner} read as none: ${read.invalidLast}` };
    const last = read.lines.at(-1) ?? null;
    return { line: last?.kind === "orchestrator" ? last : null, last, warning: null };
  } catch (e) {
    return { line: null, last: null, warning: `binding of ${owner} read as none: ${asError(e).message}` };
  }
}

/** A live run: its process holds its run lock, or its start holds its start lock. */
export function runIsLive(state: string, runId: string): boolean {
  try {
    const paths = runPaths(state, runId);
    return lockHolder(paths.runLock) !== null || lockHolder(paths.startLock) !== null;
  } catch {
    return false;
  }
}

export function ensureBoundDir(state: string): string {
  const dir = boundDir(state);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  checkTrusted(dir, "dir");
  return dir;
}

/**
 * Under the directory lock: reads the owner's file, lets `decide` choose the lines to append from its
 * last line, and appends them durably (a torn tail is cut off first: only the lock holder writes).
 */
function underLock<T>(
  state: string,
  owner: string,
  decide: (last: BoundLine | null) => { append: BoundLine[]; result: T },
): T {
  const dir = ensureBoundDir(state);
  const file = bindingFile(state, owner);
  return withDirLock(dir, () => {
    const fd = openSync(file, "a+", 0o600);
    try {
      checkTrusted(file, "file");
      const size = fstatSync(fd).size;
      const text = size > 0 ? readFileSync(fd, "utf8") : "";
      const read = parseBoundFile(text, file);
      const last = read.invalidLast === null ? (read.lines.at(-1) ?? null) : null;
      const { append, result } = decide(last);
      if (append.length > 0) {
        if (read.torn) ftruncateSync(fd, read.completeBytes);
        writeSync(fd, append.map((l) => `${serializeLine(l)}\n`).join(""));
        fsyncSync(fd);
      }
      return result;
    } finally {
      closeSync(fd);
    }
  });
}

export interface BindOptions {
  state: string;
  owner: string;
  runId: string;
  policyDigest: string;
  helperPairs: Partial<Record<HelperRole, HelperPair>>;
  /** Whether a run is live; default: its run lock or start lock is held (runIsLive). */
  isLive?: (runId: string) => boolean;
  now?: () => Date;
}

export type BindOutcome =
  | {
      bound: true;
      /** false when the owner's last line already was this run's line with this table. */
      wrote: boolean;
      line: OrchestratorLine;
      /** The run whose open line was closed first because it was no longer live. */
      closedStale: string | null;
    }
  | { bound: false; reason: "other_live_run"; liveRun: string; message: string }
  | { bound: false; reason: "unwritable" | "untrusted" | "lock_timeout"; message: string };

/**
 * BindOrchestrator: binds the owner thread to a run. The read of the thread's last line and the append
 * are one step under the directory lock. A thread holds the line of one live run: while another run's
 * open line is live, nothing is written (other_live_run, warned about by the caller); the open line of a
 * run that is not live is closed first. The run's own line with the same digest and pairs is left as it
 * is. Never throws: a binding that cannot be written is an outcome, and the run starts all the same.
 */
export function bindOrchestrator(options: BindOptions): BindOutcome {
  const now = options.now ?? (() => new Date());
  const isLive = options.isLive ?? ((id: string) => runIsLive(options.state, id));
  const line: OrchestratorLine = {
    v: 1,
    kind: "orchestrator",
    run_id: options.runId,
    policyDigest: options.policyDigest,
    helperPairs: options.helperPairs,
    at: now().toISOString(),
    pid: process.pid,
  };
  try {
    validateLine(JSON.parse(serializeLine(line)));
    return underLock<BindOutcome>(options.state, options.owner, (last) => {
      if (last?.kind === "orchestrator" && last.run_id === options.runId) {
        if (last.policyDigest === line.policyDigest && samePairs(last, line))
          return { append: [], result: { bound: true, wrote: false, line: last, closedStale: null } };
        return { append: [line], result: { bound: true, wrote: true, line, closedStale: null } };
      }
      if (last?.kind === "orchestrator") {
        if (isLive(last.run_id)) {
          return {
            append: [],
            result: {
              bound: false,
              reason: "other_live_run",
              liveRun: last.run_id,
              message: `owner thread ${options.owner} holds the line of live run ${last.run_id}: not bound`,
            },
          };
        }
        const closed: ClosedLine = {
          v: 1,
          kind: "closed",
          run_id: last.run_id,
          at: line.at,
          reason: "not_live",
        };
        return {
          append: [closed, line],
          result: { bound: true, wrote: true, line, closedStale: last.run_id },
        };
      }
      return { append: [line], result: { bound: true, wrote: true, line, closedStale: null } };
    });
  } catch (e) {
    const err = asError(e);
    const reason =
      err instanceof BoundError && (err.code === "untrusted" || err.code === "lock_timeout")
        ? err.code
        : "unwritable";
    return {
      bound: false,
      reason,
      message: `the binding of ${options.owner} cannot be written: ${err.message}`,
    };
  }
}

export type CloseOutcome = { closed: boolean; message: string };

/** CloseOrchestrator: closes the owner's line when its last line is this run's; another run's is left. */
export function closeOrchestrator(options: {
  state: string;
  owner: string;
  runId: string;
  reason?: string;
  now?: () => Date;
}): CloseOutcome {
  const at = (options.now ?? (() => new Date()))().toISOString();
  try {
    return underLock<CloseOutcome>(options.state, options.owner, (last) => {
      if (last?.kind !== "orchestrator" || last.run_id !== options.runId)
        return {
          append: [],
          result: { closed: false, message: `the owner's last line is not run ${options.runId}'s` },
        };
      const closed: ClosedLine = {
        v: 1,
        kind: "closed",
        run_id: options.runId,
        at,
        reason: options.reason ?? "run_ended",
      };
      return { append: [closed], result: { closed: true, message: `closed the line of ${options.runId}` } };
    });
  } catch (e) {
    return { closed: false, message: `the line of ${options.runId} cannot be closed: ${asError(e).message}` };
  }
}
