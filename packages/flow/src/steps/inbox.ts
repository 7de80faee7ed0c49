import { mkdirSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { writeFileAtomic } from "../util/fsx.js";
import { safeName } from "./stepBus.js";

/**
 * Dispatch reports (`inbox/`, written by `crw flow dispatched`) and the run's replies (`replies/`, written
 * by the run's process), both whole files by temporary name + rename, a reply under the report's name.
 * A report with no reply is unanswered: the run answers it when it reaches the step, a resumed run too.
 *
 * Replies:
 *   bound          the subagent is the step's; its rows are written                      (exit 0)
 *   pair_mismatch  the subagent runs another pair: close it and spawn again with `pair`  (exit 1)
 *   retry          the host or the marker turn cannot be read yet                        (exit 1)
 *   refused        another run, or not a subagent of the owner thread                    (exit 1)
 *   close          an attempt that ended, a step not published, a second subagent        (exit 1)
 *   queued         (the command's own answer) no process answered in time; it stays     (exit 1)
 */
export const REPORT_FORMAT = "crw-flow-dispatch/1";
export const REPLY_FORMAT = "crw-flow-reply/1";
export const REPLY_KINDS = ["bound", "pair_mismatch", "retry", "refused", "close"] as const;
export type ReplyKind = (typeof REPLY_KINDS)[number];

export interface DispatchReport {
  format: typeof REPORT_FORMAT;
  run_id: string;
  call: string;
  k: number;
  attempt: number;
  agent_id: string;
  at: string;
}

export interface Reply {
  format: typeof REPLY_FORMAT;
  reply: ReplyKind;
  run_id: string;
  call: string;
  k: number;
  attempt: number;
  agent_id: string;
  reason: string;
  /** For pair_mismatch: the role's pair to spawn with. */
  pair?: { model: string | null; effort: string | null };
  at: string;
}

export function reportName(call: string, k: number, attempt: number, agent: string): string {
  return `${safeName(call)}.t${k}-a${attempt}.${safeName(agent)}.json`;
}

export function writeReport(inboxDir: string, report: DispatchReport): string {
  mkdirSync(inboxDir, { recursive: true });
  const name = reportName(report.call, report.k, report.attempt, report.agent_id);
  writeFileAtomic(join(inboxDir, name), `${JSON.stringify(report)}\n`);
  return name;
}

/** Writes a reply whole (by rename); a replies directory removed meanwhile is made again. */
export function writeReply(repliesDir: string, name: string, reply: Reply): void {
  const text = `${JSON.stringify(reply)}\n`;
  try {
    writeFileAtomic(join(repliesDir, name), text);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
    mkdirSync(repliesDir, { recursive: true });
    writeFileAtomic(join(repliesDir, name), text);
  }
}

/** A reply as read back (light checks: `dispatched` reads it on the owner's per-step path). */
export function readReply(repliesDir: string, name: string): Reply | null {
  let v: unknown;
  try {
    v = JSON.parse(readFileSync(join(repliesDir, name), "utf8"));
  } catch {
    return null;
  }
  const o = v as Record<string, unknown>;
  if (!o || o.format !== REPLY_FORMAT || !REPLY_KINDS.includes(o.reply as ReplyKind)) return null;
  return o as unknown as Reply;
}

/** Report file names in the inbox that have no reply yet. */
export function unansweredReports(inboxDir: string, repliesDir: string): string[] {
  let names: string[];
  try {
    names = readdirSync(inboxDir).filter((n) => n.endsWith(".json") && !n.startsWith("."));
  } catch {
    return [];
  }
  let answered: Set<string>;
  try {
    answered = new Set(readdirSync(repliesDir));
  } catch {
    answered = new Set();
  }
  return names.filter((n) => !answered.has(n)).sort();
}
