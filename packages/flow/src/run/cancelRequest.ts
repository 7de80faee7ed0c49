import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { writeFileAtomic } from "../util/fsx.js";
import type { RunPaths } from "./paths.js";

/**
 * `crw flow cancel` asks the run's process to end the run by a request file in the run's inbox (the
 * directory that process watches): the journal has one writer, so the command never writes a row itself.
 * The file is durable before the command says it asked, and stays until the run has ended: a process that
 * dies before it journaled the request leaves it for the next one. Lightweight (no zod): the owner's
 * commands load it.
 */
export const CANCEL_FORMAT = "crw-flow-cancel/1";
/** Not a dispatch report's name (those end in .json), so the inbox's report listing never takes it in. */
const CANCEL_FILE = "cancel.request";

export interface CancelRequest {
  reason: string;
  at: string;
}

export function cancelRequestPath(paths: Pick<RunPaths, "inbox">): string {
  return join(paths.inbox, CANCEL_FILE);
}

/** Writes the request whole and durable; a request already there is replaced (its reason is the newer one). */
export function writeCancelRequest(paths: Pick<RunPaths, "inbox">, reason: string): CancelRequest {
  mkdirSync(paths.inbox, { recursive: true });
  const request: CancelRequest = { reason, at: new Date().toISOString() };
  writeFileAtomic(
    cancelRequestPath(paths),
    `${JSON.stringify({ format: CANCEL_FORMAT, ...request, pid: process.pid })}\n`,
    true,
  );
  return request;
}

/**
 * The request, or null when there is none. A file that does not read as one is still a request to cancel
 * (only the command writes it): its reason says it could not be read.
 */
export function readCancelRequest(paths: Pick<RunPaths, "inbox">): CancelRequest | null {
  // the run's loop looks on every round: no request must cost a stat, not a failed open and its error
  if (!existsSync(cancelRequestPath(paths))) return null;
  let text: string;
  try {
    text = readFileSync(cancelRequestPath(paths), "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    return { reason: `cancel request unreadable: ${(e as Error).message}`, at: new Date().toISOString() };
  }
  try {
    const v = JSON.parse(text) as Partial<CancelRequest> & { format?: unknown };
    if (v.format === CANCEL_FORMAT && typeof v.reason === "string" && typeof v.at === "string")
      return { reason: v.reason, at: v.at };
  } catch {
    // read below as a request whose reason is lost
  }
  return {
    reason: "cancel request unreadable: not a crw-flow-cancel/1 document",
    at: new Date().toISOString(),
  };
}
