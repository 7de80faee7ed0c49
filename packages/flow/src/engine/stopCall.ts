import { markerTurn } from "./bind.js";
import { turnStartedRow } from "./bindStep.js";
import type { CallFold, CallPosition } from "./callFold.js";
import { hold } from "./held.js";
import { closeUnwritten, type StepFiles } from "./publishStep.js";
import type { RunContext } from "./runContext.js";

/**
 * A pause, a cancellation, a held call elsewhere, a fatal error or the call's own deadline stops the call:
 * a running turn is interrupted (the interrupt_requested row is durable before the interrupt is sent) and
 * its thread read until it is no longer active; a step no subagent took is retracted; then the call is
 * held for the reason (the run's stop reason unless one is given).
 */
export async function stopCall(
  rc: RunContext,
  call: string,
  _fold: CallFold,
  pos: CallPosition,
  files: Map<string, StepFiles>,
  reason: string = rc.stopping?.reason ?? "stopped",
): Promise<void> {
  if (pos.kind === "terminal") return;
  if (pos.kind === "publish") {
    const rows = rc.rowsOf(call);
    const last = rows.findLast((r) => r.type !== "run_paused");
    if (last?.type !== "held") hold(rc, call, undefined, reason);
    return;
  }
  const step = pos.step;
  let agent: string | null = pos.kind === "await_bind" ? (step.agent_id ?? null) : pos.thread.thread_id;
  let turnId: string | null = pos.kind === "harvest" ? pos.turn.turn_id : null;
  if (pos.kind === "await_bind") {
    rc.bus.retractStep(call, step.k, step.attempt);
    closeUnwritten(rc, call, step, files, false);
  }
  if (agent && !turnId) {
    // a known subagent's turn for the step is bound first, so the rows name the turn the interrupt reaches
    const r = await rc.host.readThread(agent);
    const turn = r.ok ? markerTurn(r.value, step.marker) : null;
    if (turn) {
      rc.append([turnStartedRow(call, step, turn.id)]);
      turnId = turn.id;
    } else agent = null;
  }
  if (agent && turnId) {
    const r = await rc.host.readThread(agent);
    const t = r.ok ? r.value.turns.find((x) => x.id === turnId) : undefined;
    if (t?.status === "inProgress") {
      rc.append([
        {
          type: "interrupt_requested",
          call,
          op: step.op,
          reason,
          k: step.k,
          attempt: step.attempt,
          turn_id: turnId,
        },
      ]);
      await rc.host.interruptTurn(agent, turnId);
      await untilInactive(rc, agent);
    }
  }
  hold(rc, call, step.call_tokens, reason);
}

/** Reads the thread until it is no longer active and runs no turn, for at most LostAfter. */
async function untilInactive(rc: RunContext, agent: string): Promise<void> {
  const deadline = Date.now() + rc.lostAfterMs;
  while (Date.now() < deadline) {
    const seen = rc.hostVersion(agent);
    const again = await rc.host.readThread(agent);
    if (!again.ok) return;
    if (again.value.status.type !== "active" && !again.value.turns.some((t) => t.status === "inProgress"))
      return;
    await rc.hostNap(agent, seen);
  }
}

/**
 * A held call goes on only once the subagents of its held attempt run nothing: a turn still running on
 * one (the owner sent it another, or the process that held the call never saw it end) is interrupted and
 * the thread read until it is no longer active. Nothing is written: the call's rows already end held, and
 * a resume after a crash here settles them again.
 */
export async function settleHeldSubagents(rc: RunContext, agents: readonly string[]): Promise<void> {
  for (const agent of agents) {
    const r = await rc.host.readThread(agent);
    if (!r.ok) continue; // a subagent the host cannot show runs nothing the run can stop
    const running = r.value.turns.filter((t) => t.status === "inProgress");
    for (const t of running) await rc.host.interruptTurn(agent, t.id);
    if (running.length > 0 || r.value.status.type === "active") await untilInactive(rc, agent);
  }
}
