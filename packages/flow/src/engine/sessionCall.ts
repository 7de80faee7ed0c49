import { adopt, awaitBind, lookUp } from "./bindStep.js";
import { type CallFold, foldCall } from "./callFold.js";
import { attemptDeadline, DEADLINE, pastDeadline } from "./deadline.js";
import { harvest } from "./harvestTurn.js";
import { pauseForHeldCall } from "./held.js";
import { closeUnwritten, publish, type StepFiles } from "./publishStep.js";
import { settleOwnerDecision } from "./refusals.js";
import { type RunContext, RunStopped } from "./runContext.js";
import { settleHeldSubagents, stopCall } from "./stopCall.js";
import { callFailed } from "./workflow.js";

/** The attempt's first step: its deadline counts from there. */
function attemptBegun(fold: CallFold, step: { attempt: number }): { at: string } | undefined {
  return fold.steps.find((s) => s.attempt === step.attempt);
}

/**
 * Runs one session call to its terminal row: publish a step, bind the subagent the owner reports (or that
 * the host shows carrying the marker), harvest its marker turn, validate with one repair. Every move is
 * decided from the call's rows (`foldCall`), so a process that resumes the call from the journal makes the
 * same move the dead one would have.
 */
export async function runSessionCall(rc: RunContext, call: string): Promise<unknown> {
  const files = new Map<string, StepFiles>();
  const lostClock = new Map<string, { sig: string; since: number }>();
  let retracted = "";
  const lookedUp = new Set<string>();
  for (;;) {
    const fold = foldCall(rc.rowsOf(call));
    const pos = fold.position;
    if (!pos || !fold.prepared) throw new Error(`call ${call} has no prepared row`);
    if (pos.kind === "terminal") {
      if (pos.row.type === "completed") return pos.row.result;
      throw callFailed(pos.row);
    }
    if (rc.stopping) {
      await stopCall(rc, call, fold, pos, files);
      throw new RunStopped(rc.stopping.reason);
    }
    if (
      pos.kind !== "publish" &&
      pastDeadline(attemptDeadline(fold.prepared, attemptBegun(fold, pos.step)))
    ) {
      await stopCall(rc, call, fold, pos, files, DEADLINE);
      pauseForHeldCall(rc, call);
      continue;
    }
    switch (pos.kind) {
      case "publish": {
        // a call held for its owner's refusals goes on only as its decision says
        settleOwnerDecision(rc, call);
        if (foldCall(rc.rowsOf(call)).position?.kind === "terminal") break;
        if (pos.next.settle) await settleHeldSubagents(rc, pos.next.settle);
        const first = pos.next.lookupFirst;
        if (first && !lookedUp.has(first.marker)) {
          // a held call's step that was published and not bound is looked up by its marker first
          lookedUp.add(first.marker);
          if (await lookUp(rc, call, fold, first)) break;
        }
        await publish(rc, call, fold, pos.next, files);
        break;
      }
      case "await_bind":
        await awaitBind(rc, call, fold, pos.step, files);
        break;
      case "adopt":
        await adopt(rc, call, pos, lostClock);
        break;
      case "harvest":
        if (retracted !== pos.step.marker) {
          rc.bus.retractStep(call, pos.step.k, pos.step.attempt);
          closeUnwritten(rc, call, pos.step, files, true);
          retracted = pos.step.marker;
        }
        await harvest(rc, call, fold, pos, lostClock);
        break;
    }
  }
}
