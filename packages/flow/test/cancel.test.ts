import {
  type FlowRunOutcome,
  type JournalRow,
  listStepFiles,
  readJournalFile,
  writeCancelRequest,
} from "@crw/flow";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  rowsOfType,
  countSchema as schema,
  until,
} from "./helpers/harness.js";

/**
 * Two calls run side by side: the explorer's subagent is bound and its turn runs, the reviewer's step
 * waits for the owner. `crw flow cancel`'s request lands in the run's inbox; the host ends an interrupted
 * turn 400 ms after it answered the interrupt, as the real server does some time later. A third call
 * would follow the first two.
 */
describe("a cancelled run stops its calls and ends", () => {
  let r: InProcessRun;
  let rows: JournalRow[];
  let outcome: FlowRunOutcome;
  let explorer: { threadId: string; turnId: string };
  /** What the journal file held when the host received the interrupt. */
  let onDiskAtInterrupt: JournalRow[] = [];
  const interrupts: Array<{ threadId: string; turnId: string }> = [];
  let closesAfter: string[] = [];

  beforeAll(async () => {
    r = await inProcessRun();
    r.fake.setInterruptDelay(400);
    r.fake.onRequest((method, params) => {
      if (method !== "turn/interrupt") return;
      const p = params as { threadId: string; turnId: string };
      interrupts.push({ threadId: p.threadId, turnId: p.turnId });
      onDiskAtInterrupt = readJournalFile(r.paths.journal).rows;
    });
    const wf = defineWorkflow({
      name: "two-then-one",
      run: async (ctx) => {
        await Promise.all([
          ctx.call({ role: "explorer", task: "a", schema }),
          ctx.call({ role: "reviewer", task: "b", schema }),
        ]);
        return ctx.call({ role: "critic", task: "c", schema });
      },
    });
    const { done } = r.background(wf);
    const steps = await r.steps(2);
    const ex = steps.find((s) => s.call === "explorer.1");
    if (!ex) throw new Error("no explorer step");
    explorer = r.spawn(ex, "explorer");
    expect(await r.report(ex, explorer.threadId)).toBe("bound");
    await until("the explorer's turn is bound", () =>
      r.rows().some((x) => x.type === "turn_started" && x.call === "explorer.1"),
    );
    writeCancelRequest(r.paths, "wrong branch");
    outcome = await done;
    rows = r.rows();
    closesAfter = listStepFiles(r.paths.steps).closes.map((c) => c.agent_id);
  });
  afterAll(() => r?.close());

  const heldOf = (call: string) => rows.find((x) => x.type === "held" && x.call === call);
  const interruptRow = () => rowsOfType(rows, "interrupt_requested")[0];

  it("the run ends cancelled with the request's reason, after every call it stopped is held", () => {
    expect(outcome).toEqual({ state: "cancelled", reason: "wrong branch" });
    const ended = rows.at(-1);
    expect(ended).toMatchObject({ type: "run_ended", status: "cancelled", reason: "wrong branch" });
    const requested = rowsOfType(rows, "cancel_requested");
    expect(requested).toHaveLength(1);
    expect(requested[0]).toMatchObject({ reason: "wrong branch" });
    for (const call of ["explorer.1", "reviewer.1"]) {
      expect(heldOf(call)).toMatchObject({ reason: "cancelled" });
      expect((heldOf(call)?.seq ?? 0) > (requested[0]?.seq ?? 0)).toBe(true);
    }
    expect(rows.some((x) => x.type === "run_paused")).toBe(false);
  });

  it("a cancellation interrupts the bound subagent's running turn and holds the call once its thread reads inactive (S000-102)", () => {
    expect(interrupts).toEqual([{ threadId: explorer.threadId, turnId: explorer.turnId }]);
    expect(interruptRow()).toMatchObject({
      call: "explorer.1",
      reason: "cancelled",
      turn_id: explorer.turnId,
    });
    // the interrupt row was on disk before the host received the interrupt
    expect(onDiskAtInterrupt.some((x) => x.type === "interrupt_requested")).toBe(true);
    expect(r.fake.state.turn(explorer.threadId, explorer.turnId).status).toBe("interrupted");
    const ended = r.fake.interruptsEnded.find((e) => e.turnId === explorer.turnId);
    expect(ended).toBeDefined();
    expect(Date.parse(heldOf("explorer.1")?.at as string)).toBeGreaterThanOrEqual((ended?.at ?? 0) - 5);
  });

  it("the step that waited for the owner is retracted and no later call starts", () => {
    expect(listStepFiles(r.paths.steps).steps).toEqual([]);
    expect(rows.some((x) => x.type === "interrupt_requested" && x.call === "reviewer.1")).toBe(false);
    expect(rows.some((x) => x.type === "prepared" && x.call === "critic.1")).toBe(false);
  });

  it("the owner is handed a close step for the subagent the cancel left bound", () => {
    expect(closesAfter).toEqual([explorer.threadId]);
  });
});
