import { useTestDatabase } from "@crw/tools/pg";
import { afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import type { WorkflowEmitter } from "../src/index.js";

// What happened, in order: the summary being written and the publication the run waits on.
const order = vi.hoisted(() => [] as string[]);
vi.mock("../src/engine/prompt.js", async (importOriginal) => {
  const real = await importOriginal<typeof import("../src/engine/prompt.js")>();
  return {
    ...real,
    workflowSummary: (...args: Parameters<typeof real.workflowSummary>) => {
      order.push("summary");
      return real.workflowSummary(...args);
    },
  };
});

const db = useTestDatabase();
const all: Array<{ close: () => Promise<void> }> = [];
afterEach(async () => {
  for (const e of all.splice(0)) await e.close();
});

// Test files share a process and its module registry: a module another file loaded first would not be
// the mocked one, so the engine and its helpers are imported afresh here.
let src: typeof import("../src/index.js");
let h: typeof import("./helpers.js");
beforeAll(async () => {
  vi.resetModules();
  src = await import("../src/index.js");
  h = await import("./helpers.js");
});

describe("cancelling a workflow", () => {
  it("a cancellation writes its summary before it waits for its pending publication to settle (S004-283)", async () => {
    const { deferred, summaries, taskLine, until, untilAborted, world } = h;
    const w = await world(db.pool);
    const def = src.parseWorkflowDefinition(`
name: stop-me
nodes:
  - { id: slow, task: "TASK slow" }
  - { id: quick, task: "TASK quick" }
`);
    let holding = false;
    let real: WorkflowEmitter | undefined;
    // Once holding, every publication waits 500 ms: it is pending for that long, whoever waits on it.
    const emitter: WorkflowEmitter = async (update, generation) => {
      if (holding) {
        order.push("publication pending");
        await new Promise((r) => setTimeout(r, 500));
        order.push("publication settled");
      }
      return (real as WorkflowEmitter)(update, generation);
    };
    const ran: string[] = [];
    const answer = deferred<string>();
    const { engine } = await w.engine(
      async ({ task, signal }) => {
        ran.push(taskLine(task));
        return taskLine(task) === "TASK quick" ? answer.promise : untilAborted(signal);
      },
      { emitter },
    );
    real = src.pgWorkflowEmitter(engine.store);
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    await until(() => ran.length === 2, "both nodes running");
    holding = true;
    order.length = 0;
    // quick's answer is published; the cancel comes while that publication is pending
    answer.resolve("done quickly");
    await until(() => order.includes("publication pending"), "a pending publication");
    const outcome = await engine.cancel(started.workflowId, w.accountId);
    expect(outcome.status).toBe("cancelled");
    const summaryAt = order.indexOf("summary");
    expect(summaryAt).toBeGreaterThan(-1);
    expect(summaryAt).toBeLessThan(order.indexOf("publication settled"));
    expect(order.filter((e) => e === "summary")).toHaveLength(1);
    expect(outcome.summary).toContain("- slow: interrupted while running");
    expect((await summaries(db.pool, w.parentSessionId)).map((r) => r.body)).toEqual([outcome.summary]);
  });
});
