import { appendFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import {
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  rowsOfType as of,
  countSchema as schema,
  until,
} from "../helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

describe("the session host adapter's warnings", () => {
  it("what the marker search cannot tie with the hook's ledger (no_ledger_line, ledger_op_differs) is a session_host_warning row, before the bind (S000-301)", async () => {
    run = await inProcessRun();
    const r = run;
    const three = defineWorkflow({
      name: "three",
      run: async (ctx) => {
        const out: unknown[] = [];
        for (const task of ["tied", "other op", "no line"]) {
          out.push(await ctx.call({ role: "explorer", task, schema }));
        }
        return out;
      },
    });
    // the spawn hook's ledger of the owner: <state>/flow-bound/decisions/<owner>.jsonl
    const decisions = join(r.paths.state, "flow-bound", "decisions");
    mkdirSync(decisions, { recursive: true });
    const ledger = join(decisions, `${r.owner}.jsonl`);
    const line = (toolUseId: string, op: string) =>
      `${JSON.stringify({
        v: 1,
        at: new Date().toISOString(),
        owner: r.owner,
        run_id: r.spec.run_id,
        policyDigest: "d",
        tool_use_id: toolUseId,
        turn_id: null,
        decision: "allow",
        reason: null,
        role: "explorer",
        role_from: "header",
        op,
        agent_type: "explorer",
        sent: { model: null, effort: null },
        applied: { model: null, effort: null },
        warnings: [],
      })}\n`;
    appendFileSync(ledger, line("unrelated-tool-call", "elsewhere.1/t1-a1"));
    const { done } = r.background(three);
    // Each subagent is spawned and never reported: the run finds it by its marker on the host. The ledger
    // line of its spawn (keyed by the spawn item's id, the tool call's id) is written in the same tick.
    const spawnUnreported = async (n: number, ledgerOp: ((marker: string) => string) | null) => {
      await until(`step ${n}`, () => of(r.rows(), "step_published").length === n);
      const s = (await r.steps()).find((x) => x.call === `explorer.${n}`);
      if (!s) throw new Error(`no step ${n}`);
      const a = r.spawn(s, "explorer");
      const item = r.fake.state
        .get(r.owner)
        .turns.flatMap((t) => t.items)
        .find(
          (i) =>
            i.type === "collabAgentToolCall" &&
            (i as { receiverThreadIds: string[] }).receiverThreadIds.includes(a.threadId),
        );
      if (!item) throw new Error("no spawn item on the owner");
      const marker = s.message.split("\n")[0]?.replace("crw-flow-op: ", "") ?? "";
      if (ledgerOp) appendFileSync(ledger, line(item.id, ledgerOp(marker)));
      await until(`bind ${n}`, () => of(r.rows(), "thread_started").length === n);
      r.fake.answer(a.threadId, `{"n":${n}}`);
    };
    await spawnUnreported(1, (marker) => marker);
    await spawnUnreported(2, () => "explorer.9/t1-a1");
    await spawnUnreported(3, null);
    expect(await done).toEqual({ state: "completed", result: [{ n: 1 }, { n: 2 }, { n: 3 }] });
    expect(of(r.rows(), "session_host_warning")).toEqual([
      expect.objectContaining({ op: "explorer.2/t1", warnings: ["ledger_op_differs"] }),
      expect.objectContaining({ op: "explorer.3/t1", warnings: ["no_ledger_line"] }),
    ]);
    // each warning row comes before the bind it is about
    const rows = r.rows();
    for (const call of ["explorer.2", "explorer.3"]) {
      const warning = rows.findIndex((x) => x.type === "session_host_warning" && x.op === `${call}/t1`);
      const bind = rows.findIndex((x) => x.type === "thread_started" && x.call === call);
      expect(warning).toBeGreaterThan(-1);
      expect(warning).toBeLessThan(bind);
    }
  });

  it("an owner whose spawns no hook decided (no ledger) gets no ledger warning; several spawns of one marker still warn (S000-301)", async () => {
    run = await inProcessRun();
    const r = run;
    const one = defineWorkflow({
      name: "one",
      run: (ctx) => ctx.call({ role: "explorer", task: "t", schema: { type: "object" } }),
    });
    const { done } = r.background(one);
    const s = await r.firstStep();
    const a = r.spawn(s, "explorer");
    r.spawn(s, "explorer");
    await until("the bind", () => of(r.rows(), "thread_started").length === 1);
    const bound = of(r.rows(), "thread_started")[0] as { thread_id: string };
    r.fake.answer(bound.thread_id, "{}");
    if (bound.thread_id !== a.threadId) r.fake.answer(a.threadId, "{}");
    await done;
    expect(of(r.rows(), "session_host_warning")).toEqual([
      expect.objectContaining({ op: "explorer.1/t1", warnings: ["several_spawns"] }),
    ]);
  });
});
