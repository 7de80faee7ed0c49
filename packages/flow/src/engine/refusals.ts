import { readdirSync } from "node:fs";
import { WAITING_DECISION } from "../backends/decision.js";
import type { RowOf } from "../journal/rows.js";
import { readReply } from "../steps/inbox.js";
import { safeName } from "../steps/stepBus.js";
import { type RunContext, RunStopped } from "./runContext.js";

/**
 * A bound on an owner that answers a refusal by doing the same again: after `bound` refusals of one step
 * (pair_mismatch from that many subagents, refused reports; `retry` at five times the bound) the call is
 * held for a person's decision instead of being refused forever, each spawn costing a model's turn. The
 * hold is journaled (held owner_refusals, decision_requested, run_paused waiting_decision) and
 * `crw flow answer RUN <decision> retry|fail` ends it: retry publishes a new attempt, fail ends the call.
 */
export const DEFAULT_REFUSAL_BOUND = 3;
const RETRY_FACTOR = 5;
export const OWNER_REFUSALS = "owner_refusals";

export type Refusal = "pair_mismatch" | "refused" | "retry";

interface StepCounts {
  pairMismatch: Set<string>;
  refused: number;
  retry: number;
}

export function refusalDecisionId(call: string, step: { k: number; attempt: number }): string {
  return `refusals-${call}-t${step.k}-a${step.attempt}`;
}

export class RefusalBound {
  private readonly counts = new Map<string, StepCounts>();

  constructor(private readonly rc: RunContext) {}

  private get bound(): number {
    return this.rc.spec.refusal_bound ?? DEFAULT_REFUSAL_BOUND;
  }

  /**
   * Notes a refusal of the step's report before its reply is written; holds the call when the bound is
   * reached and answers the decision's question (null while under the bound). Holding first means an
   * owner that reads the reply and asks `next` at once finds the step taken back, never the old one. A
   * dead process's refusals of the step are read back from the replies it wrote.
   */
  note(
    call: string,
    step: RowOf<"step_published">,
    kind: Refusal,
    agent: string,
    reason: string,
  ): string | null {
    const c = this.countsOf(call, step, agent);
    let count: number;
    let limit = this.bound;
    if (kind === "pair_mismatch") {
      c.pairMismatch.add(agent);
      count = c.pairMismatch.size;
    } else if (kind === "refused") count = ++c.refused;
    else {
      count = ++c.retry;
      limit = this.bound * RETRY_FACTOR;
    }
    if (count < limit) return null;
    return holdForOwner(this.rc, call, step, kind, count, reason);
  }

  private countsOf(call: string, step: RowOf<"step_published">, current: string): StepCounts {
    const have = this.counts.get(step.marker);
    if (have) return have;
    const c: StepCounts = { pairMismatch: new Set(), refused: 0, retry: 0 };
    const prefix = `${safeName(call)}.t${step.k}-a${step.attempt}.`;
    let names: string[] = [];
    try {
      names = readdirSync(this.rc.paths.replies).filter((n) => n.startsWith(prefix));
    } catch {
      // no replies yet
    }
    for (const name of names) {
      const r = readReply(this.rc.paths.replies, name);
      if (r?.reply === "pair_mismatch") c.pairMismatch.add(r.agent_id);
      // a reply file is per subagent: a dead process's refused and retry replies count at least once each
      // (the report being noted, answered before by a process that died, is counted by the note itself)
      else if (r && r.agent_id !== current && r.reply === "refused") c.refused++;
      else if (r && r.agent_id !== current && r.reply === "retry") c.retry++;
    }
    this.counts.set(step.marker, c);
    return c;
  }
}

function hintFor(
  rc: RunContext,
  call: string,
  step: RowOf<"step_published">,
  kind: Refusal,
  count: number,
  reason: string,
): string {
  const id = refusalDecisionId(call, step);
  const then = `Then: crw flow answer ${rc.runId} ${id} retry (a new attempt), or fail (the call ends).`;
  if (kind === "pair_mismatch") {
    const pair = [
      step.model ? `model=${step.model}` : null,
      step.effort ? `reasoning_effort=${step.effort}` : null,
    ]
      .filter(Boolean)
      .join(" ");
    return `${call}: the owner spawned ${count} subagents for ${step.marker} with another pair than the ${step.role} role's (${reason}). Install the spawn hook so every spawn gets the role's pair (crw flow hook install, then restart the owner's Codex), or spawn with ${pair || "the role's pair"}. ${then}`;
  }
  const down = rc.hostHealth?.down();
  if (kind === "retry" && down)
    return `${call}: crw cannot reach the owner's Codex host ${down.host}: ${down.why}. To fix: ${down.fix}. ${then}`;
  return `${call}: ${count} reports for ${step.marker} were answered ${kind} (${reason}). ${then}`;
}

function holdForOwner(
  rc: RunContext,
  call: string,
  step: RowOf<"step_published">,
  kind: Refusal,
  count: number,
  reason: string,
): string {
  const id = refusalDecisionId(call, step);
  const question = hintFor(rc, call, step, kind, count, reason);
  rc.append([
    { type: "held", call, op: call, reason: OWNER_REFUSALS, detail: `${count} ${kind}: ${reason}` },
    { type: "decision_requested", decision: id, question, options: ["retry", "fail"] },
    { type: "run_paused", reason: `${WAITING_DECISION}:${id}`, call },
  ]);
  // the step is no longer the owner's to take
  rc.bus.retractStep(call, step.k, step.attempt);
  rc.emit({ type: "call_ended", call, status: `held (${OWNER_REFUSALS}: ${kind})` });
  rc.stop(`${WAITING_DECISION}:${id}`);
  return question;
}

/**
 * Before a held call publishes again: a call held for the owner's refusals goes on only when its decision
 * is answered (retry), ends null_model on fail, and pauses the run again while it is unanswered.
 */
export function settleOwnerDecision(rc: RunContext, call: string): void {
  const rows = rc.rowsOf(call);
  const held = rows.findLast((r) => r.type === "held");
  if (held?.type !== "held" || held.reason !== OWNER_REFUSALS) return;
  if (rows.some((r) => r.type === "step_published" && r.seq > held.seq)) return;
  const step = rows.findLast(
    (r): r is RowOf<"step_published"> => r.type === "step_published" && r.seq < held.seq,
  );
  if (!step) return;
  const id = refusalDecisionId(call, step);
  const answered = rc.journal.rows.find((r) => r.type === "decision_answered" && r.decision === id);
  if (answered?.type === "decision_answered") {
    if (answered.answer === "fail")
      rc.append([
        {
          type: "null_model",
          call,
          op: call,
          reason: OWNER_REFUSALS,
          errors: [held.detail ?? ""],
          tokens: {},
        },
      ]);
    return;
  }
  rc.append([{ type: "run_paused", reason: `${WAITING_DECISION}:${id}`, call }]);
  rc.stop(`${WAITING_DECISION}:${id}`);
  throw new RunStopped(`${WAITING_DECISION}:${id}`);
}
