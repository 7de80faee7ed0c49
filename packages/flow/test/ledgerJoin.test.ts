import { appendLedger, type LedgerLine } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import { answerSchema, defineWorkflow, type InProcessRun, inProcessRun } from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

describe("the ledger join", () => {
  it("the run joins the hook ledger's op with the owner's collabAgentToolCall spawn items to find a published step's subagent (S000-289)", async () => {
    run = await inProcessRun({});
    const r = run;
    const { done } = r.background(
      defineWorkflow({
        name: "join",
        run: (ctx) => ctx.call({ role: "explorer", task: "one", schema: answerSchema }),
      }),
    );
    const [step] = await r.steps(1);
    if (!step) throw new Error("no step");
    const agent = r.spawn(step, "explorer");
    // the owner's spawn item shows no prompt (nothing carries the marker there), and the owner reports
    // nothing: only the hook's ledger line of the op ties the tool call to the step
    const ownerTurns = r.fake.state.get(r.owner).turns;
    const item = ownerTurns
      .flatMap((t) => t.items)
      .find((i) => i.type === "collabAgentToolCall" && i.receiverThreadIds.includes(agent.threadId));
    if (item?.type !== "collabAgentToolCall") throw new Error("no spawn item");
    (item as { prompt: string | null }).prompt = null;
    const line: LedgerLine = {
      v: 1,
      at: new Date().toISOString(),
      owner: r.owner,
      run_id: r.spec.run_id,
      policyDigest: "d",
      tool_use_id: item.id,
      turn_id: null,
      decision: "allow",
      reason: null,
      role: "explorer",
      role_from: "crw-role",
      op: step.marker,
      agent_type: "explorer",
      sent: { model: null, effort: null },
      applied: { model: null, effort: null },
      warnings: [],
    };
    appendLedger(r.paths.state, line);
    r.fake.answer(agent.threadId, '{"summary":"s","score":1}');
    expect(await done).toMatchObject({ state: "completed" });
    expect(r.rows().find((x) => x.type === "thread_started")).toMatchObject({ thread_id: agent.threadId });
  });
});
