import type { HostThread } from "../host/sessionHost.js";
import type { NewRow } from "../journal/rows.js";
import { sleep } from "../util/fsx.js";
import { judgeBind, markerTurn } from "./bind.js";
import { type CallFold, type CallPosition, foldCall } from "./callFold.js";
import { placedCwds, writeEvidenceRecord } from "./evidence.js";
import { clockRanOut, loseAttempt } from "./harvestTurn.js";
import { hold, pauseForHeldCall } from "./held.js";
import { ledgerWarnings } from "./hostWarnings.js";
import { packetTextOf, type Step, type StepFiles, writeStepFiles } from "./publishStep.js";
import { answerReports, type BindHandler } from "./reports.js";
import type { RunContext } from "./runContext.js";

export async function awaitBind(
  rc: RunContext,
  call: string,
  fold: CallFold,
  step: Step,
  files: Map<string, StepFiles>,
) {
  let state = files.get(step.marker);
  const resumed = !state;
  if (!state) {
    state = {
      written: false,
      since: 0,
      failures: 0,
      firstAt: null,
      lastAt: null,
      warned: false,
      lastError: "",
    };
    files.set(step.marker, state);
  }
  // A report the owner wrote first, then the host's own record of the marker.
  const since = rc.inboxVersion(); // a report landing after this ends the nap below at once
  const onBind: BindHandler = (thread, verdict) => bind(rc, call, fold, step, thread, verdict);
  if (await answerReports(rc, call, step, onBind)) return;
  // The owner normally reports; the host lookup is the fallback, so a fresh step waits a while for it.
  if (Date.now() - state.since >= rc.lookupEveryMs) {
    state.since = Date.now();
    if (await lookUp(rc, call, fold, step)) return;
  }
  if (!state.written) {
    await writeStepFiles(rc, step, packetTextOf(rc, fold, step), state);
    if (resumed && state.written)
      rc.emit({ type: "step_published", call, marker: step.marker, action: step.action });
  }
  await rc.nap(since);
}

/**
 * The pair a step's subagent is bound on: the role's pinned pair, with a continuation's explicit effort
 * in place of an effort the role leaves undecided.
 */
export function stepPair(rc: RunContext, step: Step): { model: string | null; effort: string | null } {
  const pin = rc.pins[step.role];
  if (pin.effort !== null) return pin;
  const prepared = rc.rowsOf(step.call).find((r) => r.type === "prepared");
  const explicit = prepared?.type === "prepared" ? (prepared.input.effort ?? null) : null;
  return explicit ? { model: pin.model, effort: explicit } : pin;
}

/** While a step waits, the marker is looked up on the host so an unreported spawn or repair binds too. */
export async function lookUp(rc: RunContext, call: string, fold: CallFold, step: Step): Promise<boolean> {
  const pair = stepPair(rc, step);
  let candidates: HostThread[];
  if (step.action === "send_input" && step.agent_id) {
    const r = await rc.host.readThread(step.agent_id);
    if (!r.ok) return false;
    candidates = [r.value];
  } else {
    // The owner thread's spawnAgent items name the subagent that took the marker: one read of the owner
    // and one of each candidate, instead of a read of every subagent the owner ever spawned.
    const r = await rc.spawnedFor(step.marker);
    if (!r.ok) return false;
    candidates = r.value.filter((t) => markerTurn(t, step.marker) !== null);
    const bound = new Set(foldCall(rc.rowsOf(call)).threads.map((t) => t.thread_id));
    candidates = candidates.filter((t) => !bound.has(t.id));
    if (candidates.length > 1)
      rc.append([{ type: "session_host_warning", op: step.op, warnings: ["several_spawns"] }]);
  }
  for (const thread of candidates) {
    const v = judgeBind(step, thread, rc.owner, pair);
    if (v.verdict === "bind") {
      const warnings = step.action === "spawn" ? await ledgerWarnings(rc, step, thread) : [];
      if (warnings.length > 0) rc.append([{ type: "session_host_warning", op: step.op, warnings }]);
      // an evidence record that cannot be placed holds the call (the step is decided either way)
      if ((await bind(rc, call, fold, step, thread, v)).bound)
        rc.emit({ type: "bound", call, marker: step.marker, agent: thread.id, via: "lookup" });
      return true;
    }
  }
  return false;
}

/**
 * Writes the bind rows in one batch (thread_started for a spawn, turn_started always), then retracts. A
 * spawn step with a flow evidence record places it first: evidence_placed (durable) when no row of the
 * call's newest generation names the subagent's host cwd, then the record there; a record that cannot be
 * written leaves the subagent unbound and holds the call evidence_assignment_failed (the run pauses).
 */
async function bind(
  rc: RunContext,
  call: string,
  fold: CallFold,
  step: Step,
  thread: HostThread,
  v: Extract<ReturnType<typeof judgeBind>, { verdict: "bind" }>,
): Promise<{ bound: true } | { bound: false; reason: string }> {
  const rows: NewRow[] = [];
  let evidenceCwd: string | null = null;
  if (step.action === "spawn" && step.evidence_assignment) {
    const placed = placeEvidence(rc, call, step, thread);
    if (!placed.ok) {
      hold(rc, call, step.call_tokens, "evidence_assignment_failed", placed.error);
      rc.bus.retractStep(call, step.k, step.attempt);
      pauseForHeldCall(rc, call);
      return { bound: false, reason: `evidence_assignment_failed: ${placed.error}` };
    }
    evidenceCwd = placed.cwd;
  }
  if (step.action === "spawn") {
    const priorPairs = fold.threads
      .map((t) => ({ model: t.model, effort: t.effort }))
      .filter((p) => p.model !== thread.model || p.effort !== thread.reasoningEffort);
    rows.push({
      type: "thread_started",
      call,
      thread_id: thread.id,
      model: thread.model,
      effort: thread.reasoningEffort,
      cwd: step.workspace,
      host_cwd: thread.cwd,
      parent_thread_id: thread.parentThreadId,
      agent_role: thread.agentRole,
      attempt: step.attempt,
      via: "session",
      rollout_path: thread.rolloutPath,
      marker: step.marker,
      ...(v.pairUnchecked ? { pair_unchecked: true } : {}),
      ...(v.effortUnchecked ? { effort_unchecked: true } : {}),
      ...(v.agentRoleMismatch ? { session_agent_role_mismatch: v.agentRoleMismatch } : {}),
      ...(priorPairs.length > 0 ? { prior_pairs: priorPairs } : {}),
      ...(evidenceCwd !== null ? { evidence_cwd: evidenceCwd } : {}),
    });
  }
  rows.push(turnStartedRow(call, step, v.turn.id));
  const sameThread = step.action === "spawn" ? sameThreadReview(rc, call, step, thread.id) : null;
  if (sameThread) rows.push(sameThread);
  await rc.appendDurable(rows);
  rc.bus.retractStep(call, step.k, step.attempt);
  return { bound: true };
}

const REVIEW_ROLES = new Set(["reviewer", "critic"]);
const AUTHOR_ROLES = new Set(["executor", "executor-t1", "architect"]);

/**
 * Same-thread review, observed: a reviewer's or critic's step bound to a subagent that an author call of the
 * run (executor, executor-t1, architect) was bound to (the owner sent the review to the author's thread).
 * It is a warning, never a refusal: the review is bound and runs.
 */
function sameThreadReview(rc: RunContext, call: string, step: Step, threadId: string): NewRow | null {
  if (!REVIEW_ROLES.has(step.role)) return null;
  const author = rc.journal.rows.find(
    (r) =>
      r.type === "thread_started" &&
      r.thread_id === threadId &&
      r.call !== call &&
      rc.rowsOf(r.call).some((p) => p.type === "prepared" && AUTHOR_ROLES.has(p.role)),
  );
  if (author?.type !== "thread_started") return null;
  return {
    type: "flow_warning",
    warning: "same_thread_review",
    call,
    op: step.op,
    detail: { thread_id: threadId, author_call: author.call, role: step.role },
  };
}

/** evidence_placed (when the cwd is new to the call's newest generation), then the record under the cwd. */
function placeEvidence(
  rc: RunContext,
  call: string,
  step: Step,
  thread: HostThread,
): { ok: true; cwd: string } | { ok: false; error: string } {
  const cwd = thread.cwd;
  const assignment = step.evidence_assignment as string;
  if (!cwd) return { ok: false, error: `the host reports no cwd for ${thread.id}` };
  if (!placedCwds(rc.rowsOf(call)).includes(cwd)) {
    rc.append([
      {
        type: "evidence_placed",
        call,
        evidence_assignment: assignment,
        evidence_cwd: cwd,
        attempt: step.attempt,
        marker: step.marker,
      },
    ]);
  }
  try {
    writeEvidenceRecord(cwd, {
      v: 1,
      kind: "crw-flow-evidence",
      run_id: rc.runId,
      call,
      evidence_assignment: assignment,
      marker: step.marker,
      attempt: step.attempt,
      role: step.role,
      workspace: step.workspace,
      placed_at: new Date().toISOString(),
    });
  } catch (e) {
    return { ok: false, error: `the record cannot be written under ${cwd}: ${(e as Error).message}` };
  }
  return { ok: true, cwd };
}

export function turnStartedRow(call: string, step: Step, turnId: string): NewRow {
  return {
    type: "turn_started",
    call,
    op: step.op,
    k: step.k,
    turn_id: turnId,
    attempt: step.attempt,
    marker: step.marker,
    conversation_turn: step.conversation_turn,
    ...(step.replaces_turn !== undefined ? { replaces_turn: step.replaces_turn } : {}),
  };
}

/** Last row thread_started: adopt the subagent, write only its turn_started. */
export async function adopt(
  rc: RunContext,
  call: string,
  pos: Extract<CallPosition, { kind: "adopt" }>,
  lostClock: Map<string, { sig: string; since: number }>,
): Promise<void> {
  const seen = rc.hostVersion(pos.thread.thread_id);
  const r = await rc.host.readThread(pos.thread.thread_id);
  if (r.ok) {
    const turn = markerTurn(r.value, pos.step.marker);
    if (turn) {
      rc.append([turnStartedRow(call, pos.step, turn.id)]);
      rc.emit({ type: "bound", call, marker: pos.step.marker, agent: r.value.id, via: "adopt" });
      return;
    }
  }
  if (!r.ok && r.reason === "unreachable") {
    await sleep(rc.pollMs);
    return;
  }
  const status = r.ok ? r.value.status.type : "unknown";
  if (status === "notLoaded" || status === "systemError" || status === "unknown") {
    if (clockRanOut(rc, lostClock, pos.step.marker, status)) {
      await loseAttempt(
        rc,
        call,
        pos.step,
        pos.thread.thread_id,
        null,
        `thread ${status} for LostAfter`,
        status,
        null,
      );
      return;
    }
  }
  await rc.hostNap(pos.thread.thread_id, seen);
}
