import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { JournalWriter, spawnMessage } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import {
  appendStartedPrepared,
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  countSchema as schema,
} from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const one = defineWorkflow({
  name: "one",
  run: (ctx) => ctx.call({ role: "explorer", task: "count", schema }),
});

describe("an interrupt goes with its turn across a restart", () => {
  it("S000-109 S000-110 S000-111 S000-112: a resumed process ends the turn the interrupt_requested row names held, whatever it came to; the next attempt has no intent", async () => {
    run = await inProcessRun();
    const { paths } = run;
    const call = "explorer.1";
    const workspace = join(paths.workspaces, call);
    mkdirSync(workspace, { recursive: true });
    const packet = join(paths.steps, call, "packet-t1-a1.md");
    const marker = `${call}/t1-a1`;
    // the subagent took the step and its turn then completed, after the dead process asked to interrupt it
    const a = run.fake.spawnSubagent({
      ownerThreadId: run.owner,
      message: spawnMessage(marker, "explorer", workspace, packet),
      agentRole: "explorer",
    });
    run.fake.answer(a.threadId, '{"n":1}');
    const input = { role: "explorer" as const, task: "count", schema, workspace: null };
    const w = JournalWriter.create(paths.journal, run.spec.run_id);
    appendStartedPrepared(w, call, input, workspace);
    w.append([
      {
        type: "step_published",
        call,
        op: `${call}/t1`,
        k: 1,
        marker,
        attempt: 1,
        action: "spawn",
        input: "count",
        input_digest: "sha256:i",
        packet,
        packet_digest: "sha256:p",
        role: "explorer",
        agent_type: "explorer",
        model: null,
        effort: null,
        workspace,
        conversation_turn: 1,
      },
    ]);
    w.append([
      {
        type: "thread_started",
        call,
        thread_id: a.threadId,
        model: null,
        effort: null,
        cwd: workspace,
        host_cwd: null,
        parent_thread_id: run.owner,
        agent_role: "explorer",
        attempt: 1,
        via: "session",
        rollout_path: null,
        marker,
      },
      {
        type: "turn_started",
        call,
        op: `${call}/t1`,
        k: 1,
        turn_id: a.turnId,
        attempt: 1,
        marker,
        conversation_turn: 1,
      },
    ]);
    w.append([
      {
        type: "interrupt_requested",
        call,
        op: `${call}/t1`,
        reason: "usage_limit",
        k: 1,
        attempt: 1,
        turn_id: a.turnId,
      },
    ]);
    w.close();

    const { done } = run.background(one);
    const [s2] = await run.steps();
    if (!s2) throw new Error("no next attempt");
    const rows = run.rows().filter((r) => "call" in r && r.call === call);
    const held = rows.find((r) => r.type === "held");
    expect(held).toMatchObject({ reason: "usage_limit" }); // the completed turn ends held for the row's reason
    expect(rows.some((r) => r.type === "completed")).toBe(false);
    expect(s2).toMatchObject({ k: 2, attempt: 2, action: "spawn" });
    const b = run.spawn(s2, "explorer");
    expect(await run.report(s2, b.threadId)).toBe("bound");
    run.fake.answer(b.threadId, '{"n":2}');
    expect(await done).toEqual({ state: "completed", result: { n: 2 } }); // the new attempt carries no intent
    const after = run.rows();
    expect(after.filter((r) => r.type === "interrupt_requested")).toHaveLength(1);
  });
});
