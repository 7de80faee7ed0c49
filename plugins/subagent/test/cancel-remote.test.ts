import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { parseWorkflowDefinition } from "../src/index.js";
import {
  closeEnginesAfterEach,
  deferred,
  summaries,
  taskLine,
  until,
  untilAborted,
  world,
} from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

const def = parseWorkflowDefinition(`
name: remote-stop
nodes:
  - { id: slow, task: "TASK slow" }
  - { id: fast, task: "TASK fast" }
  - { id: after, task: "TASK after", dependsOn: [slow] }
`);

describe("a Stop asked of another daemon", () => {
  it("is delivered to the owner through the database and cancels there (listening owner)", async () => {
    const w = await world(db.pool);
    const ran: string[] = [];
    const owner = await w.engine(
      async ({ task, signal }) => {
        ran.push(taskLine(task));
        return untilAborted(signal);
      },
      { listenForCancel: true },
    );
    all.push(owner.engine);
    const other = await w.engine(() => "never");
    all.push(other.engine);
    const started = await owner.engine.start(w.ctx(), { definition: def });
    await until(() => ran.length === 2, "slow and fast running");
    expect(await other.engine.requestCancel(started.workflowId, w.accountId)).toBe("requested");
    const outcome = await owner.engine.finished(started.workflowId);
    expect(outcome.status).toBe("cancelled");
    expect(outcome.summary).toContain("- slow: interrupted while running");
    expect(outcome.summary).toContain("- after: cancelled before it started");
    expect(await summaries(db.pool, w.parentSessionId)).toHaveLength(1);
    expect(await other.engine.requestCancel(started.workflowId, w.accountId)).toBe("not_running");
  });

  it("is noticed at the owner's next journal write when it does not listen, and at boot when the owner died", async () => {
    const w = await world(db.pool);
    const fastGate = deferred();
    const ran: string[] = [];
    const owner = await w.engine(async ({ task, signal }) => {
      ran.push(taskLine(task));
      if (taskLine(task) === "TASK fast") {
        await fastGate.promise;
        return "fast done";
      }
      return untilAborted(signal);
    });
    all.push(owner.engine);
    const other = await w.engine(() => "never");
    all.push(other.engine);
    const started = await owner.engine.start(w.ctx(), { definition: def });
    await until(() => ran.length === 2, "slow and fast running");
    expect(await other.engine.requestCancel(started.workflowId, w.accountId)).toBe("requested");
    fastGate.resolve(); // fast settles: its journal write reads the recorded Stop
    const outcome = await owner.engine.finished(started.workflowId);
    expect(outcome.status).toBe("cancelled");
    expect(outcome.summary).toContain("- fast: succeeded");
    expect(outcome.summary).toContain("- slow: interrupted while running");

    // The owner dies with a Stop recorded: the next boot cancels instead of resuming.
    const w2 = await world(db.pool);
    const dying = await w2.engine(async ({ signal }) => untilAborted(signal));
    all.push(dying.engine);
    const second = await dying.engine.start(w2.ctx(), { definition: def });
    await until(() => dying.engine.run(second.workflowId)?.started.size === 2, "running");
    await dying.engine.close();
    expect(await other.engine.requestCancel(second.workflowId, w2.accountId)).toBe("requested");
    const resumedRuns: string[] = [];
    const booted = await w2.engine(({ task }) => {
      resumedRuns.push(task);
      return "x";
    });
    all.push(booted.engine);
    await booted.engine.recoverInterrupted();
    const bootOutcome = await booted.engine.finished(second.workflowId);
    expect(bootOutcome.status).toBe("cancelled");
    expect(bootOutcome.summary).toContain("- slow: interrupted while running");
    expect(bootOutcome.summary).toContain("- after: cancelled before it started");
    expect(resumedRuns).toEqual([]); // nothing was continued: the recorded Stop won
  });
});
