import { type RunContext, RunStopped } from "../engine/runContext.js";
import type { DecideOptions } from "../engine/workflow.js";
import { FlowError } from "../util/errors.js";

/** The run_paused reason of a run that waits for a decision. */
export const WAITING_DECISION = "waiting_decision";

/**
 * `ctx.decide`: an answered decision returns its stored answer (on every replay); an unanswered one is
 * recorded once (decision_requested), the run pauses waiting_decision and its process ends, and
 * `crw flow answer` stores the answer and resumes the run.
 */
export async function decide(rc: RunContext, o: DecideOptions): Promise<string> {
  if (typeof o?.id !== "string" || o.id.length === 0 || typeof o.question !== "string") {
    throw new FlowError("input", "ctx.decide needs an id and a question", 2);
  }
  const rows = rc.journal.rows;
  const answered = rows.find((r) => r.type === "decision_answered" && r.decision === o.id);
  if (answered?.type === "decision_answered") return answered.answer;
  if (rc.stopping) throw new RunStopped(rc.stopping.reason);
  if (!rows.some((r) => r.type === "decision_requested" && r.decision === o.id)) {
    rc.append([
      {
        type: "decision_requested",
        decision: o.id,
        question: o.question,
        ...(o.options ? { options: o.options } : {}),
      },
    ]);
  }
  rc.append([{ type: "run_paused", reason: `${WAITING_DECISION}:${o.id}` }]);
  rc.stop(`${WAITING_DECISION}:${o.id}`);
  throw new RunStopped(`${WAITING_DECISION}:${o.id}`);
}
