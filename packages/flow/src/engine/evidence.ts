import { mkdirSync, readdirSync, rmdirSync } from "node:fs";
import { join } from "node:path";
import type { JournalRow, RowOf } from "../journal/rows.js";
import type { RoleName } from "../run/roles.js";
import { removeIfExists, writeFileAtomic } from "../util/fsx.js";

/**
 * Flow evidence records. In a run with an evidence cwd (run.json `evidence: true`, `crw flow start
 * --evidence`), each spawn step of a gated executor role (executor, executor-t1: the roles whose work the
 * gate judges) names a flow evidence record, its evidence_assignment. When the owner's subagent is bound,
 * the record is written under the cwd the host reports for it (its parent's: the cwd its stop hook claims
 * its receipt under), so the hook finds what it works for. The journal knows every copy:
 *
 * - a bind whose host cwd no row of the call's newest generation names writes evidence_placed (the intent:
 *   assignment, cwd, attempt, marker) and only then writes the record there, before thread_started (which
 *   carries evidence_cwd);
 * - a record that cannot be written leaves the subagent unbound, and the call is held
 *   evidence_assignment_failed;
 * - the release (the run's end; a superseded or prepared-again call) and the restore (a resumed process,
 *   for its open calls) read the copies from the evidence_placed rows alone.
 *
 * evidence_placed changes no reading of the call's state (foldCall skips it).
 */

export const GATED_ROLES: readonly RoleName[] = ["executor", "executor-t1"];

/** The directory under an evidence cwd that holds the flow evidence records. */
export const EVIDENCE_DIR = join(".crw", "flow-evidence");

export function isGated(role: RoleName): boolean {
  return GATED_ROLES.includes(role);
}

/**
 * The record a call's spawn steps name: `flow:<run>/<call>/g<n>`, n the call's generation (its prepared
 * rows so far). Every attempt of a generation names the same record, so each (cwd, assignment) of its
 * evidence_placed rows is one file, rewritten at each bind with the step it serves: the rows name every
 * copy there is.
 */
export function evidenceAssignment(runId: string, call: string, generation: number): string {
  return `flow:${runId}/${call}/g${Math.max(1, generation)}`;
}

/** Where an assignment's record lives under a cwd (the name keeps no path separator). */
export function evidenceRecordPath(cwd: string, assignment: string): string {
  return join(cwd, EVIDENCE_DIR, `${assignment.replace(/^flow:/, "").replace(/[/\\:]/g, "~")}.json`);
}

/** A call's newest generation: its rows from its newest prepared row on (all its rows when it has none). */
export function newestGeneration(rows: readonly JournalRow[]): JournalRow[] {
  let from = 0;
  rows.forEach((r, i) => {
    if (r.type === "prepared") from = i;
  });
  return rows.slice(from);
}

/** The cwds the newest generation's evidence_placed rows name, in order, each once. */
export function placedCwds(rows: readonly JournalRow[]): string[] {
  const cwds: string[] = [];
  for (const r of newestGeneration(rows)) {
    if (r.type === "evidence_placed" && !cwds.includes(r.evidence_cwd)) cwds.push(r.evidence_cwd);
  }
  return cwds;
}

/**
 * What a spawn step of the call records: its assignment, the cwds it was written under before the row
 * (the newest generation's placements) and the ones ignored (an older generation's: released, never
 * restored for this step).
 */
export function stepEvidence(
  runId: string,
  call: string,
  rows: readonly JournalRow[],
): { evidence_assignment: string; evidence_cwds: string[]; evidence_ignored: string[] } {
  const newest = placedCwds(rows);
  const ignored: string[] = [];
  for (const r of rows) {
    if (r.type === "evidence_placed" && !newest.includes(r.evidence_cwd) && !ignored.includes(r.evidence_cwd))
      ignored.push(r.evidence_cwd);
  }
  return {
    evidence_assignment: evidenceAssignment(runId, call, rows.filter((r) => r.type === "prepared").length),
    evidence_cwds: newest,
    evidence_ignored: ignored,
  };
}

export interface EvidenceRecord {
  v: 1;
  kind: "crw-flow-evidence";
  run_id: string;
  call: string;
  evidence_assignment: string;
  marker: string;
  attempt: number;
  role: string;
  workspace: string;
  placed_at: string;
}

/** Writes a record (temp name, fsync, rename, fsync of the directory); throws when it cannot. */
export function writeEvidenceRecord(cwd: string, record: EvidenceRecord): string {
  const path = evidenceRecordPath(cwd, record.evidence_assignment);
  mkdirSync(join(cwd, EVIDENCE_DIR), { recursive: true });
  writeFileAtomic(path, `${JSON.stringify(record)}\n`, true);
  return path;
}

/** Every copy the rows name: (cwd, assignment) of each evidence_placed row, of every generation. */
export function evidenceCopies(
  rows: readonly JournalRow[],
): Array<{ call: string; cwd: string; assignment: string; path: string }> {
  const seen = new Set<string>();
  const out: Array<{ call: string; cwd: string; assignment: string; path: string }> = [];
  for (const r of rows) {
    if (r.type !== "evidence_placed") continue;
    const path = evidenceRecordPath(r.evidence_cwd, r.evidence_assignment);
    if (seen.has(path)) continue;
    seen.add(path);
    out.push({ call: r.call, cwd: r.evidence_cwd, assignment: r.evidence_assignment, path });
  }
  return out;
}

/**
 * The release: removes every copy the rows name (of the given calls, or of all), and the records
 * directory when it is left empty. Answers the paths removed; a copy already gone is no error.
 */
export function releaseEvidence(rows: readonly JournalRow[], calls?: ReadonlySet<string>): string[] {
  const removed: string[] = [];
  const dirs = new Set<string>();
  for (const c of evidenceCopies(rows)) {
    if (calls && !calls.has(c.call)) continue;
    try {
      if (removeIfExists(c.path)) removed.push(c.path);
      dirs.add(join(c.cwd, EVIDENCE_DIR));
    } catch {
      // a copy that cannot be removed stays; the next release finds it again from the rows
    }
  }
  for (const dir of dirs) {
    try {
      if (readdirSync(dir).length === 0) rmdirSync(dir);
    } catch {
      // gone already, or not empty
    }
  }
  return removed;
}

/**
 * The restore of a resumed call: writes again the record of each evidence_placed row of its newest
 * generation (a record the dead process had not written yet, or that was removed meanwhile). Answers the
 * paths written and the ones that could not be.
 */
export function restoreEvidence(
  runId: string,
  callRows: readonly JournalRow[],
): { written: string[]; failed: Array<{ path: string; error: string }> } {
  const written: string[] = [];
  const failed: Array<{ path: string; error: string }> = [];
  const generation = newestGeneration(callRows);
  const prepared = generation.find((r): r is RowOf<"prepared"> => r.type === "prepared");
  for (const r of generation) {
    if (r.type !== "evidence_placed") continue;
    const path = evidenceRecordPath(r.evidence_cwd, r.evidence_assignment);
    try {
      writeEvidenceRecord(r.evidence_cwd, {
        v: 1,
        kind: "crw-flow-evidence",
        run_id: runId,
        call: r.call,
        evidence_assignment: r.evidence_assignment,
        marker: r.marker,
        attempt: r.attempt,
        role: prepared?.role ?? "executor",
        workspace: prepared?.allocation.workspace ?? "",
        placed_at: r.at,
      });
      written.push(path);
    } catch (e) {
      failed.push({ path, error: (e as Error).message });
    }
  }
  return { written, failed };
}
