import type { HostThread, HostTurn } from "../host/sessionHost.js";
import type { RowOf, Tokens } from "../journal/rows.js";
import { digestOf } from "../util/canonical.js";
import { sleep } from "../util/fsx.js";
import { answerText, judgeAnswer } from "./answer.js";
import {
  addTokens,
  type CallFold,
  type CallPosition,
  foldCall,
  type NextStep,
  subtractTokens,
} from "./callFold.js";
import { hold, pauseForHeldCall } from "./held.js";
import { publish, type Step } from "./publishStep.js";
import type { RunContext } from "./runContext.js";
import { completionMembers } from "./workspace.js";

export async function harvest(
  rc: RunContext,
  call: string,
  fold: CallFold,
  pos: Extract<CallPosition, { kind: "harvest" }>,
  lostClock: Map<string, { sig: string; since: number }>,
): Promise<void> {
  const { step, thread, turn } = pos;
  const intent =
    fold.interrupt && fold.interrupt.k === step.k && fold.interrupt.attempt === step.attempt
      ? fold.interrupt
      : null;
  // a notification after this read ends the wait below at once (it changed what the read saw)
  const seen = rc.hostVersion(thread.thread_id);
  const r = await rc.host.readThread(thread.thread_id);
  if (!r.ok && r.reason === "unreachable") {
    await sleep(rc.pollMs); // a host that cannot be asked judges nothing
    return;
  }
  const hostThread = r.ok ? r.value : null;
  const t = hostThread?.turns.find((x) => x.id === turn.turn_id) ?? null;
  const threadStatus = hostThread ? hostThread.status.type : "unknown";
  const badThread =
    threadStatus === "notLoaded" || threadStatus === "systemError" || threadStatus === "unknown";
  if (intent && t && t.status !== "inProgress") {
    hold(rc, call, step.call_tokens, intent.reason, `the turn ${t.status} after the interrupt`);
    return;
  }
  // A thread the host no longer holds never ends its turn, however often it is interrupted: such a turn is
  // judged by the loss rules below, and the attempt after it starts with no intent.
  if (intent && t?.status === "inProgress" && !badThread) {
    await rc.host.interruptTurn(thread.thread_id, turn.turn_id);
    await rc.hostNap(thread.thread_id, seen);
    return;
  }
  if (t && hostThread && t.status === "completed") {
    await evaluate(rc, call, step, thread, hostThread, t);
    return;
  }
  if (t && hostThread && (t.status === "failed" || t.status === "interrupted") && t.error) {
    await onFailedTurn(rc, call, step, t);
    return;
  }
  const endedWithoutError = t !== null && (t.status === "failed" || t.status === "interrupted");
  if (badThread || endedWithoutError) {
    const sig = `${threadStatus}:${t?.status ?? "none"}:${t?.items.length ?? 0}`;
    const ranOut = clockRanOut(rc, lostClock, step.marker, sig);
    if ((badThread && endedWithoutError) || ranOut) {
      // the thread is read once more before the attempt is judged lost
      const again = await rc.host.readThread(thread.thread_id);
      if (!again.ok && again.reason === "unreachable") return;
      const t2 = again.ok ? (again.value.turns.find((x) => x.id === turn.turn_id) ?? null) : null;
      const status2 = again.ok ? again.value.status.type : "unknown";
      const stillBad = status2 === "notLoaded" || status2 === "systemError" || status2 === "unknown";
      if (t2?.status === "completed" || (t2?.error ?? null) !== null) return; // harvested next round
      if (!stillBad && t2?.status === "inProgress") return; // it came back: wait for it
      await loseAttempt(
        rc,
        call,
        step,
        thread.thread_id,
        turn.turn_id,
        endedWithoutError ? `turn ${t?.status} without an error` : `no change for ${rc.lostAfterMs} ms`,
        status2,
        t2?.status ?? null,
      );
      return;
    }
  } else {
    lostClock.delete(step.marker);
  }
  await rc.hostNap(thread.thread_id, seen);
}

export function clockRanOut(
  rc: RunContext,
  clocks: Map<string, { sig: string; since: number }>,
  key: string,
  sig: string,
): boolean {
  const now = Date.now();
  const c = clocks.get(key);
  if (!c || c.sig !== sig) {
    clocks.set(key, { sig, since: now });
    return false;
  }
  return now - c.since >= rc.lostAfterMs;
}

export async function loseAttempt(
  rc: RunContext,
  call: string,
  step: Step,
  agent: string,
  turnId: string | null,
  reason: string,
  hostStatus: string,
  turnStatus: string | null,
): Promise<void> {
  rc.append([
    {
      type: "session_attempt_lost",
      call,
      op: step.op,
      attempt: step.attempt,
      agent_id: agent,
      k: step.k,
      turn_id: turnId,
      reason,
      host_status: hostStatus,
      turn_status: turnStatus,
    },
  ]);
  rc.emit({ type: "attempt_lost", call, attempt: step.attempt, reason });
}

async function onFailedTurn(rc: RunContext, call: string, step: Step, t: HostTurn): Promise<void> {
  const info = t.error?.codexErrorInfo ?? null;
  const message = t.error?.message ?? "";
  if (info && /usage|rate/i.test(info)) {
    hold(rc, call, step.call_tokens, "usage_limit", `${info}: ${message}`);
    rc.append([{ type: "run_paused", reason: "usage_limit", call }]);
    rc.stop("usage_limit");
    return;
  }
  if (info === "contextWindowExceeded") {
    rc.append([
      {
        type: "null_model",
        call,
        op: call,
        reason: "context_window_exceeded",
        tokens: step.call_tokens ?? {},
      },
    ]);
    await closeAgent(rc, call);
    return;
  }
  hold(rc, call, step.call_tokens, "host_failure", `${info ?? "failed"}: ${message}`);
  pauseForHeldCall(rc, call);
}

async function evaluate(
  rc: RunContext,
  call: string,
  step: Step,
  thread: RowOf<"thread_started">,
  hostThread: HostThread,
  t: HostTurn,
): Promise<void> {
  const text = answerText(t);
  let cumulative: Tokens | undefined;
  const tc = await rc.host.readTokenCount(hostThread);
  if (tc.ok && tc.value) cumulative = tc.value;
  else {
    rc.append([
      {
        type: "tokens_unmeasured",
        call,
        op: step.op,
        k: step.k,
        turn_id: t.id,
        pauses: false,
        reason: tc.ok ? "the rollout has no token_count yet" : `${tc.reason}: ${tc.message}`,
      },
    ]);
  }
  // what the subagent's earlier turns counted: the step's (a send_input), else, for a subagent another
  // call was bound to first (a same-thread review), that call's count at its harvest
  const seen = step.tokens_seen ?? rc.threadCountBefore(thread.thread_id, call);
  const delta = cumulative ? subtractTokens(cumulative, seen) : {};
  const threadTokens = cumulative
    ? { thread_tokens: { thread_id: thread.thread_id, tokens: addTokens(cumulative, undefined) } }
    : {};
  const callTokens = addTokens(step.call_tokens, delta);
  const prepared = foldCall(rc.rowsOf(call)).prepared as RowOf<"prepared">;
  const verdict = judgeAnswer(text, prepared.input.schema);
  if (verdict.ok) {
    // the trace's harvest digests see P as the subagent left it, before crw commits it
    await rc.tracer?.harvest(call, prepared);
    const members = await completionMembers(rc, call, prepared, step.attempt);
    await rc.appendDurable([
      {
        type: "completed",
        call,
        op: call,
        k: step.k,
        attempt: step.attempt,
        result: verdict.value,
        result_digest: digestOf(verdict.value),
        raw_text: verdict.text,
        extracted: verdict.extracted,
        tokens: callTokens,
        ...threadTokens,
        ...members,
      },
    ]);
    rc.emit({ type: "call_ended", call, status: "completed" });
    await closeAgent(rc, call);
    return;
  }
  const { errors } = verdict;
  if (step.repair) {
    rc.append([
      {
        type: "null_model",
        call,
        op: call,
        reason: "answer_invalid_after_repair",
        ...(text !== null ? { raw_text: text } : {}),
        errors,
        tokens: callTokens,
        ...threadTokens,
      },
    ]);
    rc.emit({ type: "call_ended", call, status: "null_model" });
    await closeAgent(rc, call);
    return;
  }
  const open = hostThread.status.type !== "notLoaded" && hostThread.status.type !== "systemError";
  const answer = text ?? "";
  const next: NextStep = open
    ? {
        k: step.k + 1,
        attempt: step.attempt,
        action: "send_input",
        agent_id: thread.thread_id,
        repair: { answer, errors },
        previous_answer: answer,
        // a turn left unmeasured: the repair counts from what the thread counted before this call's turns
        tokens_seen: cumulative ? subtractTokens(cumulative, {}) : (seen ?? {}),
        call_tokens: callTokens,
        conversation_turn: 2,
        close: [],
      }
    : {
        k: step.k + 1,
        attempt: step.attempt + 1,
        action: "spawn",
        repair: { answer, errors },
        previous_answer: answer,
        call_tokens: callTokens,
        conversation_turn: 2,
        close: [{ attempt: step.attempt, agent_id: thread.thread_id }],
      };
  const fold = foldCall(rc.rowsOf(call));
  await publish(rc, call, fold, next, new Map());
}

/**
 * The subagent is closed once the call has its terminal row, or a cancel stopped it: one close file for its
 * newest subagent, unless a later attempt's step closed that one already (a lost or held attempt's).
 */
export async function closeAgent(rc: RunContext, call: string): Promise<void> {
  const fold = foldCall(rc.rowsOf(call));
  const last = fold.threads[fold.threads.length - 1];
  if (last && !fold.steps.some((s) => s.attempt > last.attempt)) {
    rc.bus.writeClose({
      run_id: rc.runId,
      call,
      attempt: last.attempt,
      action: "close",
      agent_id: last.thread_id,
    });
  }
}
