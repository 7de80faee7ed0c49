import { mkdirSync } from "node:fs";
import { bindRunOwner, closeRunOwner } from "../bound/run.js";
import { JournalWriter } from "../journal/journal.js";
import type { JournalRow, NewRow, Pair, RowOf } from "../journal/rows.js";
import { cancelRequestPath } from "../run/cancelRequest.js";
import { type RoleName, readRoleTable, rolePairs } from "../run/roles.js";
import { FlowError } from "../util/errors.js";
import { removeIfExists } from "../util/fsx.js";
import { foldBranch } from "./branchFold.js";
import { foldCall } from "./callFold.js";
import { releaseEvidence, restoreEvidence } from "./evidence.js";
import { CANCELLED, FlowRun, type FlowRunOptions, type FlowRunOutcome, startedBackend } from "./flowRun.js";
import { RunBranch } from "./runBranch.js";
import type { FlowEvent } from "./runContext.js";
import { runWorkflowPath } from "./workflow.js";

/**
 * One run process's work: open (or create) the journal, refuse a mixed backend before any row, write the
 * started row that pins the role pairs, run the workflow (replaying finished ops from the journal), and
 * end with run_ended, or stop with the calls held when the run pauses.
 */
export async function executeRun(opts: FlowRunOptions): Promise<FlowRunOutcome> {
  const { paths, spec } = opts;
  const env = opts.env ?? process.env;
  mkdirSync(paths.steps, { recursive: true });
  mkdirSync(paths.inbox, { recursive: true });
  mkdirSync(paths.replies, { recursive: true });
  let journal: JournalWriter;
  try {
    const opened = JournalWriter.open(paths.journal, env);
    journal = opened.writer;
    if (opened.read.torn) {
      opts.onEvent?.({
        type: "warning",
        message: `journal: a torn last line (${opened.read.torn.bytes} bytes) was cut off and ignored`,
      });
    }
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
    journal = JournalWriter.create(paths.journal, spec.run_id, env);
  }
  try {
    const recorded = startedBackend(journal.rows);
    if (recorded !== null && recorded !== spec.backend) {
      throw new FlowError(
        "mixed_backend",
        `run ${spec.run_id} runs on the ${recorded} backend (its started row); a resume on ${spec.backend} is refused`,
        2,
      );
    }
    const table = readRoleTable(spec.repo);
    const pins = rolePairs(table) as Record<RoleName, Pair>;
    const previous = [...journal.rows].reverse().find((r) => r.type === "started");
    const startedN = journal.rows.filter((r) => r.type === "started").length + 1;
    const workflowPath = opts.workflowPath ?? runWorkflowPath(journal.rows, spec);
    const startRows: NewRow[] = [
      {
        type: "started",
        backend: spec.backend,
        role_pairs: pins,
        policy_digest: table.policy_digest,
        process: opts.processToken,
        pid: process.pid,
        process_n: startedN,
        ...(workflowPath !== spec.workflow ? { workflow: workflowPath } : {}),
      },
    ];
    if (previous?.type === "started" && previous.policy_digest !== table.policy_digest) {
      startRows.push({
        type: "policy_repinned",
        pinned_digest: previous.policy_digest,
        store_digest: table.policy_digest,
        role_pairs: pins,
      });
    }
    const ended = journal.rows.find((r) => r.type === "run_ended");
    if (ended?.type === "run_ended") {
      // a process that died after the run's last row left the branch's refs where they were
      if (foldBranch(journal.rows)) {
        const branch = await RunBranch.open(branchHost(opts, journal));
        await branch
          ?.end()
          .catch((e: Error) => opts.onEvent?.({ type: "warning", message: `run branch: ${e.message}` }));
      }
      closeHolder(opts);
      releaseEvidence(journal.rows);
      return endedOutcome(ended);
    }
    const run = new FlowRun({ ...opts, workflowPath }, journal, table, pins);
    run.append(startRows);
    run.branch = await RunBranch.open(branchHost(opts, journal, run));
    bindHolder(opts, table.policy_digest, pins);
    if (startedN > 1) restoreOpenEvidence(opts, journal.rows);
    const outcome = await run.execute();
    if (outcome.state !== "paused") {
      // a cancel request that came too late for a run that ended otherwise is spent too
      removeIfExists(cancelRequestPath(paths));
      closeHolder(opts);
      // the run is over: every flow evidence copy its rows name is released
      releaseEvidence(journal.rows);
    }
    return outcome;
  } finally {
    opts.onStats?.({ ...journal.stats });
    journal.close();
  }
}

function endedOutcome(ended: RowOf<"run_ended">): FlowRunOutcome {
  if (ended.status === "completed") return { state: "completed", result: ended.result };
  if (ended.status === "cancelled") return { state: "cancelled", reason: ended.reason ?? CANCELLED };
  return { state: "failed", error: ended.error ?? "failed" };
}

function branchHost(opts: FlowRunOptions, journal: JournalWriter, run?: FlowRun) {
  return {
    runId: opts.spec.run_id,
    repo: opts.spec.repo,
    rows: () => journal.rows,
    append: (rows: NewRow[]) => (run ? run.append(rows) : journal.append(rows)),
    emit: (event: FlowEvent) => (run ? run.emit(event) : opts.onEvent?.(event)),
  };
}

/**
 * The holder writes the owner's orchestrator line right after its started row, with the pairs that row
 * pinned (written only when the last line is not already its own with that digest); a line that cannot
 * be written is a warning, the run goes on.
 */
function bindHolder(opts: FlowRunOptions, policyDigest: string, pins: Record<RoleName, Pair>): void {
  if (!opts.spec.owner || opts.spec.backend !== "session") return;
  const b = bindRunOwner({
    state: opts.paths.state,
    owner: opts.spec.owner,
    runId: opts.spec.run_id,
    policyDigest,
    rolePairs: pins,
  });
  if (b.warning) opts.onEvent?.({ type: "warning", message: `owner binding: ${b.warning}` });
}

/**
 * A resumed process restores the flow evidence records of its open calls (every copy of each call's newest
 * generation, from the evidence_placed rows): a record the dead process had not written yet, or that was
 * removed meanwhile, is there again before any of its steps is bound.
 */
function restoreOpenEvidence(opts: FlowRunOptions, rows: readonly JournalRow[]): void {
  const calls = new Set<string>();
  for (const r of rows) if (r.type === "evidence_placed") calls.add(r.call);
  for (const call of calls) {
    const own = rows.filter((r) => "call" in r && r.call === call);
    if (foldCall(own).position?.kind === "terminal") continue;
    for (const f of restoreEvidence(opts.spec.run_id, own).failed) {
      opts.onEvent?.({
        type: "warning",
        message: `flow evidence: the record ${f.path} of ${call} cannot be restored: ${f.error}`,
      });
    }
  }
}

/** The holder closes its line when the run ends (completed or failed; never on a pause). */
function closeHolder(opts: FlowRunOptions): void {
  if (!opts.spec.owner || opts.spec.backend !== "session") return;
  try {
    closeRunOwner({
      state: opts.paths.state,
      owner: opts.spec.owner,
      runId: opts.spec.run_id,
      reason: "run_ended",
    });
  } catch (e) {
    opts.onEvent?.({
      type: "warning",
      message: `owner binding: the line cannot be closed: ${(e as Error).message}`,
    });
  }
}
