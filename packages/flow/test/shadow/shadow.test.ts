import { afterEach, describe, expect, it } from "vitest";
import type { JournalRow } from "../../src/journal/rows.js";
import { shadowReplay } from "../../src/shadow/replay.js";
import { answerSchema, defineWorkflow, type InProcessRun, inProcessRun, json } from "../helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const pair = (task = "combine") =>
  defineWorkflow({
    name: "pair",
    async run(ctx) {
      const [a, b] = await Promise.all([
        ctx.call({ role: "explorer", task: "find A", schema: answerSchema }),
        ctx.call({ role: "reviewer", task: "judge B", schema: answerSchema }),
      ]);
      const c = await ctx.call({ role: "architect", task, schema: answerSchema });
      return { a, b, c };
    },
  });

async function sessionRun(): Promise<JournalRow[]> {
  run = await inProcessRun();
  const { outcome } = await run.execute(pair(), (step) =>
    json({ summary: `answer to ${step.call}`, score: 1 }),
  );
  expect(outcome.state).toBe("completed");
  return run.rows();
}

describe("crw flow shadow: a replay from the journal alone, no host", () => {
  it("a session run replays with no divergence and the report names the recorded backend (S000-008)", async () => {
    const rows = await sessionRun();
    const report = await shadowReplay("run-1", pair(), null, rows);
    expect(report).toMatchObject({
      backend: "session",
      recorded: "completed",
      replay: "completed",
      ops_replayed: 3,
      ops_recorded: 3,
      divergences: [],
    });
  });

  it("a journal whose started row records no backend is reported as an App Server run (S000-008)", async () => {
    const rows = (await sessionRun()).map((r) => {
      if (r.type !== "started") return r;
      const { backend: _dropped, ...rest } = r;
      return rest as JournalRow;
    });
    const report = await shadowReplay("run-1", pair(), null, rows);
    expect(report.backend).toBe("app-server");
    expect(report.divergences).toEqual([]);
  });

  it("a changed workflow diverges at the op whose input differs; the replay stops there", async () => {
    const rows = await sessionRun();
    const report = await shadowReplay("run-1", pair("combine differently"), null, rows);
    expect(report.replay).toBe("incomplete");
    expect(report.divergences).toEqual([
      expect.objectContaining({ kind: "input_digest_differs", op: "architect.1" }),
    ]);
  });

  it("a recorded result that its own recorded answer does not give is a divergence", async () => {
    const rows = (await sessionRun()).map((r) =>
      r.type === "completed" && r.call === "reviewer.1"
        ? { ...r, result: { summary: "forged", score: 1 } }
        : r,
    );
    const report = await shadowReplay("run-1", pair(), null, rows);
    const kinds = report.divergences.map((d) => `${d.kind}@${d.op}`);
    expect(kinds).toContain("result_digest_differs@reviewer.1");
    expect(kinds).toContain("answer_differs@reviewer.1");
    expect(kinds).toContain("run_result_differs@null");
  });

  it("a workflow that no longer asks for a recorded call reports op_not_replayed; one that asks for more stops", async () => {
    const rows = await sessionRun();
    const fewer = defineWorkflow({
      name: "pair",
      async run(ctx) {
        const a = await ctx.call({ role: "explorer", task: "find A", schema: answerSchema });
        return { a };
      },
    });
    const r1 = await shadowReplay("run-1", fewer, null, rows);
    expect(r1.divergences.map((d) => `${d.kind}@${d.op}`)).toEqual(
      expect.arrayContaining([
        "op_not_replayed@reviewer.1",
        "op_not_replayed@architect.1",
        "run_result_differs@null",
      ]),
    );
    const more = defineWorkflow({
      name: "pair",
      async run(ctx) {
        const out = await pair().run(ctx, null);
        await ctx.call({ role: "critic", task: "one more", schema: answerSchema });
        return out;
      },
    });
    const r2 = await shadowReplay("run-1", more, null, rows);
    expect(r2.replay).toBe("incomplete");
    expect(r2.divergences).toEqual([expect.objectContaining({ kind: "op_not_in_journal", op: "critic.1" })]);
  });
});
