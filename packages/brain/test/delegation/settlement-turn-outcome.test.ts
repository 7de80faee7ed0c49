import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { createScriptedTurnRunner, type SessionTurnRunner, type TurnOutcome } from "../../src/index.js";
import { makeService, newParent, queuedCall, scriptTask } from "./helpers.js";

const db = useTestDatabase();

/**
 * A queued call run to its settlement, the runner reporting `instead(n)` (when it answers one) as the
 * outcome of the child's n-th turn (1-based) once the scripted model ran it. A text follow-up is queued
 * during the first turn when `steered`, so that a follow-up turn runs. Returns the settled run.
 */
async function callWithTurnOutcomes(instead: (n: number) => TurnOutcome | undefined, steered = false) {
  const scripted = createScriptedTurnRunner();
  let childId = "";
  let principal = "";
  let turns = 0;
  const runner: SessionTurnRunner = {
    async runTurn(request, host) {
      const outcome = await scripted.runTurn(request, host);
      if (request.sessionId !== childId) return outcome;
      turns++;
      if (steered && turns === 1) await repo.enqueueSteer(childId, principal, "also this");
      return instead(turns) ?? outcome;
    },
  };
  const { service, repo } = makeService(db.pool, { runner });
  const caller = await newParent(service);
  principal = caller.account.id;
  const run = await queuedCall(service, caller, "call", scriptTask({ answer: "answered" }));
  childId = run.childSessionId ?? "";
  await service.executeRun(run);
  await service.whenIdle();
  const settled = await repo.getRun(run.id, caller.account.id);
  await service.close();
  return { run: settled, turns };
}

describe("how a call's turns end decides how it settles", () => {
  it("a first turn the runner reports stopped (not the caller's stop) ends the call as stopped", async () => {
    const { run, turns } = await callWithTurnOutcomes((n) =>
      n === 1 ? { stopReason: "aborted" } : undefined,
    );
    expect(turns).toBe(1);
    expect(run.status).toBe("failed");
    expect(run.error).toEqual({ code: "aborted", message: "the call was stopped" });
  });

  it("a first turn that fails without a message fails the call as the child's turn failed", async () => {
    const { run } = await callWithTurnOutcomes((n) => (n === 1 ? { stopReason: "error" } : undefined));
    expect(run.error).toEqual({ code: "child_failed", message: "the child's turn failed" });
  });

  it("a follow-up turn that fails without a message fails the call as the follow-up turn failed", async () => {
    const { run, turns } = await callWithTurnOutcomes(
      (n) => (n === 2 ? { stopReason: "error" } : undefined),
      true,
    );
    expect(turns).toBe(2);
    expect(run.error).toEqual({ code: "child_failed", message: "the follow-up turn failed" });
  });
});
