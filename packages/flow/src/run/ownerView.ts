import { closeSync, fstatSync, openSync, readFileSync, readSync } from "node:fs";
import { join } from "node:path";
import { writeFileAtomic } from "../util/fsx.js";
import { type LightRow, lightRowsOf, readLightRows } from "./lightJournal.js";
import type { RunPaths } from "./paths.js";

/**
 * What the owner's per-step commands (`next`, `cancel`, `resume`) need from a run's journal, as a fold of
 * its rows: the newest started, paused and ended rows, the calls still open with their subagents, the
 * turns taken, the decisions asked and the owner's host as last reported. `crw flow next` runs once per
 * step, so the fold is kept beside the journal with the byte offset it covers (`owner-view.json`) and
 * each command folds only the rows appended since: its cost stays flat as the run grows.
 */
export interface OwnerView {
  started: LightRow | null;
  ended: LightRow | null;
  paused: LightRow | null;
  /** The seq of the newest policy_repinned row. */
  repinnedSeq: number | null;
  /** Open calls (prepared, neither completed nor null_model) with the subagent threads each started. */
  calls: Record<string, string[]>;
  /** Subagents whose attempt was lost. */
  lost: string[];
  /** Markers of every turn_started row: a step whose turn was taken is never handed out again. */
  turned: string[];
  decisions: Record<string, { question: string; options?: unknown }>;
  /** The newest host_unreachable warning's detail, unless a host_reachable came after it. */
  hostDown: { host: string; why: string; fix: string } | null;
}

export const emptyOwnerView = (): OwnerView => ({
  started: null,
  ended: null,
  paused: null,
  repinnedSeq: null,
  calls: {},
  lost: [],
  turned: [],
  decisions: {},
  hostDown: null,
});

/** Folds `rows` (in journal order) into `view`, in place. */
export function foldOwnerView(view: OwnerView, rows: readonly LightRow[]): OwnerView {
  for (const r of rows) foldRow(view, r);
  return view;
}

function foldRow(view: OwnerView, r: LightRow): void {
  const call = typeof r.call === "string" ? r.call : null;
  switch (r.type) {
    case "started":
      view.started = r;
      return;
    case "run_ended":
      view.ended = r;
      return;
    case "run_paused":
      view.paused = r;
      return;
    case "policy_repinned":
      view.repinnedSeq = r.seq;
      return;
    case "prepared":
      if (call && !view.calls[call]) view.calls[call] = [];
      return;
    case "completed":
    case "null_model":
      if (call) delete view.calls[call];
      return;
    case "thread_started":
      if (call) view.calls[call]?.push(String(r.thread_id));
      return;
    case "session_attempt_lost":
      if (typeof r.agent_id === "string") view.lost.push(r.agent_id);
      return;
    case "turn_started":
      view.turned.push(String(r.marker));
      return;
    case "decision_requested":
      // the first request of a decision is the one asked
      if (String(r.decision) in view.decisions) return;
      view.decisions[String(r.decision)] = {
        question: String(r.question ?? ""),
        ...(r.options ? { options: r.options } : {}),
      };
      return;
    case "flow_warning":
      if (r.warning === "host_reachable") view.hostDown = null;
      else if (r.warning === "host_unreachable") {
        const d = (r.detail ?? {}) as Record<string, unknown>;
        view.hostDown = { host: String(d.host ?? ""), why: String(d.why ?? ""), fix: String(d.fix ?? "") };
      }
      return;
  }
}

/** The subagents of open calls: per call its newest thread whose attempt was not lost. */
export function openCallAgents(view: OwnerView): string[] {
  const lost = new Set(view.lost);
  const out: string[] = [];
  for (const threads of Object.values(view.calls)) {
    const live = threads.filter((t) => !lost.has(t));
    const newest = live[live.length - 1];
    if (newest !== undefined) out.push(newest);
  }
  return out;
}

interface Kept {
  /** The journal's header line: another journal at the same path (a run made again) is not this one. */
  header: string;
  /** Bytes of the journal folded: whole lines only. */
  offset: number;
  view: OwnerView;
}

const keptPath = (paths: RunPaths) => join(paths.dir, "owner-view.json");

/**
 * The run's owner view: the kept fold and the rows appended after it, or the whole journal when no fold
 * is kept, or the kept one is of another journal or past its end. The fold is kept again when rows were
 * added; a run directory that cannot be written loses only that.
 */
export function readOwnerView(paths: RunPaths): OwnerView {
  let fd: number;
  try {
    fd = openSync(paths.journal, "r");
  } catch {
    return emptyOwnerView();
  }
  try {
    const size = fstatSync(fd).size;
    const header = readHeader(fd, size);
    if (header === null) return foldOwnerView(emptyOwnerView(), readLightRows(paths.journal));
    const headerEnd = Buffer.byteLength(header) + 1;
    const kept = readKept(paths);
    const usable = kept !== null && kept.header === header && kept.offset <= size && kept.offset >= headerEnd;
    const from = usable ? kept.offset : headerEnd;
    const view = usable ? kept.view : emptyOwnerView();
    if (from >= size) return view;
    const tail = Buffer.alloc(size - from);
    readSync(fd, tail, 0, tail.length, from);
    const end = tail.lastIndexOf(0x0a);
    if (end < 0) return view; // only a torn last line since
    const rows = lightRowsOf(tail.subarray(0, end).toString("utf8").split("\n"));
    foldOwnerView(view, rows);
    keep(paths, { header, offset: from + end + 1, view });
    return view;
  } finally {
    closeSync(fd);
  }
}

/** The journal's first line (without its newline), or null when its first 64 KiB hold none. */
function readHeader(fd: number, size: number): string | null {
  const head = Buffer.alloc(Math.min(size, 65_536));
  readSync(fd, head, 0, head.length, 0);
  const nl = head.indexOf(0x0a);
  return nl < 0 ? null : head.subarray(0, nl).toString("utf8");
}

function readKept(paths: RunPaths): Kept | null {
  try {
    const k = JSON.parse(readFileSync(keptPath(paths), "utf8")) as Kept;
    return typeof k.header === "string" && typeof k.offset === "number" && k.view ? k : null;
  } catch {
    return null;
  }
}

function keep(paths: RunPaths, kept: Kept): void {
  try {
    writeFileAtomic(keptPath(paths), JSON.stringify(kept));
  } catch {
    // the next command folds from further back
  }
}
