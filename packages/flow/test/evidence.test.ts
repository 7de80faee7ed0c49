import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  evidenceCopies,
  evidenceRecordPath,
  foldCall,
  type JournalRow,
  JournalWriter,
  newestGeneration,
  releaseEvidence,
  restoreEvidence,
  stepEvidence,
} from "@crw/flow";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { answerSchema, defineWorkflow, type InProcessRun, inProcessRun, json } from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

type Row = JournalRow & Record<string, unknown>;
const of = (rows: JournalRow[], type: string, call?: string) =>
  rows.filter((r) => r.type === type && (call === undefined || ("call" in r && r.call === call))) as Row[];

const build = defineWorkflow({
  name: "evidence",
  run: async (ctx) => {
    const [built, looked] = await Promise.all([
      ctx.call({ role: "executor", task: "build it", schema: answerSchema }),
      ctx.call({ role: "explorer", task: "look around", schema: answerSchema }),
    ]);
    return { built, looked };
  },
});

async function take(r: InProcessRun, call: string, agentType = "worker") {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const step = (await r.steps(1)).find((s) => s.call === call);
    if (step) {
      const agent = r.spawn(step, agentType);
      return { step, agent: agent.threadId, reply: await r.report(step, agent.threadId) };
    }
    if (Date.now() > deadline) throw new Error(`no step of ${call}`);
    await new Promise((res) => setTimeout(res, 10));
  }
}

describe("flow evidence records", () => {
  describe("a run with an evidence cwd binding a gated executor and an explorer", () => {
    let r: InProcessRun;
    let repo: string;
    let assignment: string;
    let record: string;
    let bound: JournalRow[];
    let explorerRows: JournalRow[];
    // whether the record was there as the evidence_placed row went to the journal, and once it was durable
    const atPlaced: Array<{ before: boolean; durable: boolean }> = [];
    let releasedAtEnd: boolean;
    let recordAtBind: unknown;

    beforeAll(async () => {
      r = await inProcessRun({});
      r.spec.evidence = true;
      repo = r.spec.repo; // the owner's cwd: the cwd the host reports for its subagents
      assignment = `flow:${r.spec.run_id}/executor.1/g1`;
      record = evidenceRecordPath(repo, assignment);
      const append = JournalWriter.prototype.append;
      const spy = vi.spyOn(JournalWriter.prototype, "append").mockImplementation(function (
        this: JournalWriter,
        batch,
      ) {
        const placed = batch.some((x) => x.type === "evidence_placed");
        const before = placed && existsSync(record);
        const rows = append.call(this, batch);
        if (placed) atPlaced.push({ before, durable: existsSync(record) });
        return rows;
      });
      const { done } = r.background(build);
      try {
        const ex = await take(r, "executor.1");
        expect(ex.reply).toBe("bound");
        bound = r.rows();
        recordAtBind = JSON.parse(readFileSync(record, "utf8"));
        const lo = await take(r, "explorer.1", "explorer");
        expect(lo.reply).toBe("bound");
        explorerRows = r.rows();
        r.fake.answer(ex.agent, '{"summary":"built","score":1}');
        r.fake.answer(lo.agent, '{"summary":"looked","score":2}');
        expect(await done).toMatchObject({ state: "completed" });
      } finally {
        spy.mockRestore();
      }
      releasedAtEnd = !existsSync(record);
    }, 60_000);

    afterAll(async () => {
      await r?.close();
    });

    it("the gated executor's spawn step names its record, with no cwd written under yet and none ignored; the explorer's names none (S000-023)", () => {
      expect(of(bound, "step_published", "executor.1")[0]).toMatchObject({
        action: "spawn",
        evidence_assignment: assignment,
        evidence_cwds: [],
        evidence_ignored: [],
      });
      const explorerStep = of(explorerRows, "step_published", "explorer.1")[0];
      expect(explorerStep).toBeDefined();
      expect(explorerStep?.evidence_assignment).toBeUndefined();
      expect(explorerStep?.evidence_cwds).toBeUndefined();
    });

    it("the executor's thread_started carries evidence_cwd, the host cwd; the explorer's none (S000-076)", () => {
      expect(of(bound, "thread_started", "executor.1")[0]).toMatchObject({
        evidence_cwd: repo,
        host_cwd: repo,
      });
      const explorerThread = of(explorerRows, "thread_started", "explorer.1")[0];
      expect(explorerThread).toBeDefined();
      expect(explorerThread?.evidence_cwd).toBeUndefined();
    });

    it("the bind under a cwd no row names writes evidence_placed before the record and before thread_started (S000-081)", () => {
      expect(atPlaced).toEqual([{ before: false, durable: false }]);
      const placed = of(bound, "evidence_placed", "executor.1");
      const thread = of(bound, "thread_started", "executor.1")[0];
      expect(placed).toHaveLength(1);
      expect(placed[0]?.seq).toBeLessThan(thread?.seq as number);
    });

    it("evidence_placed carries the assignment, the cwd, the attempt and the marker, durable before the record is written (S000-169)", () => {
      expect(of(bound, "evidence_placed", "executor.1")).toEqual([
        expect.objectContaining({
          evidence_assignment: assignment,
          evidence_cwd: repo,
          attempt: 1,
          marker: "executor.1/t1-a1",
        }),
      ]);
      expect(atPlaced[0]?.durable).toBe(false);
    });

    it("the record under the host cwd names the run, the call, the assignment, the marker and the role; the run's end removes it (S000-171)", () => {
      expect(recordAtBind).toMatchObject({
        kind: "crw-flow-evidence",
        run_id: r.spec.run_id,
        call: "executor.1",
        evidence_assignment: assignment,
        marker: "executor.1/t1-a1",
        role: "executor",
      });
      expect(releasedAtEnd).toBe(true);
    });
  });

  it("a later attempt's spawn step lists the cwds its record was written under before the row; the same cwd is not placed twice (S000-023)", async () => {
    run = await inProcessRun({ lostAfterMs: 200 });
    const r = run;
    r.spec.evidence = true;
    const one = defineWorkflow({
      name: "one",
      run: (ctx) => ctx.call({ role: "executor", task: "build it", schema: answerSchema }),
    });
    const { done } = r.background(one);
    const first = await take(r, "executor.1");
    expect(first.reply).toBe("bound");
    r.fake.setThreadStatus(first.agent, "notLoaded"); // the turn never changes: lost after LostAfter
    const deadline = Date.now() + 10_000;
    let second: Awaited<ReturnType<typeof take>> | null = null;
    while (!second) {
      const s = (await r.steps(1)).find((x) => x.call === "executor.1" && x.attempt === 2);
      if (s) {
        const a = r.spawn(s, "worker");
        second = { step: s, agent: a.threadId, reply: await r.report(s, a.threadId) };
      } else if (Date.now() > deadline) throw new Error("no second attempt");
      else await new Promise((res) => setTimeout(res, 20));
    }
    expect(second.reply).toBe("bound");
    const steps = of(r.rows(), "step_published", "executor.1");
    expect(steps.map((s) => s.attempt)).toEqual([1, 2]);
    expect(steps[1]).toMatchObject({
      evidence_assignment: `flow:${r.spec.run_id}/executor.1/g1`,
      evidence_cwds: [r.spec.repo],
    });
    expect(of(r.rows(), "evidence_placed")).toHaveLength(1);
    expect(of(r.rows(), "thread_started").map((t) => t.evidence_cwd)).toEqual([r.spec.repo, r.spec.repo]);
    const record = evidenceRecordPath(r.spec.repo, `flow:${r.spec.run_id}/executor.1/g1`);
    expect(JSON.parse(readFileSync(record, "utf8"))).toMatchObject({
      attempt: 2,
      marker: "executor.1/t1-a2",
    });
    r.fake.answer(second.agent, '{"summary":"built","score":1}');
    expect(await done).toMatchObject({ state: "completed" });
    expect(existsSync(record)).toBe(false);
  });

  it("a record that cannot be placed leaves the subagent unbound and holds the call evidence_assignment_failed; the resume binds it once it can (S000-082)", async () => {
    run = await inProcessRun({});
    const r = run;
    r.spec.evidence = true;
    const one = defineWorkflow({
      name: "one",
      run: (ctx) => ctx.call({ role: "executor", task: "build it", schema: answerSchema }),
    });
    // the records' directory cannot be made under the owner's cwd: a file is in its place
    mkdirSync(join(r.spec.repo, ".crw"), { recursive: true });
    writeFileSync(join(r.spec.repo, ".crw", "flow-evidence"), "not a directory");
    const first = r.background(one);
    const t = await take(r, "executor.1");
    expect(t.reply).toBe("close");
    expect(await first.done).toEqual({ state: "paused", reason: "held:executor.1" });
    let rows = r.rows();
    expect(of(rows, "thread_started")).toHaveLength(0);
    expect(of(rows, "turn_started")).toHaveLength(0);
    expect(of(rows, "held", "executor.1")).toEqual([
      expect.objectContaining({ reason: "evidence_assignment_failed" }),
    ]);
    expect(String(of(rows, "held")[0]?.detail)).toContain(r.spec.repo);
    // the intent was recorded before the write that failed: the release finds the copy's place
    expect(of(rows, "evidence_placed")).toHaveLength(1);
    // the place can be written again: the resume looks the step's marker up first and binds that subagent
    rmSync(join(r.spec.repo, ".crw", "flow-evidence"));
    const second = r.background(one);
    await waitFor(() => of(r.rows(), "thread_started").length === 1);
    rows = r.rows();
    expect(of(rows, "thread_started")[0]).toMatchObject({ thread_id: t.agent, evidence_cwd: r.spec.repo });
    expect(of(rows, "evidence_placed")).toHaveLength(1);
    r.fake.answer(t.agent, '{"summary":"built","score":1}');
    expect(await second.done).toMatchObject({ state: "completed" });
  });

  it("a resumed process writes again the record of an open call, removed while no process ran, before any of its steps is bound (S000-171)", async () => {
    run = await inProcessRun({});
    const r = run;
    r.spec.evidence = true;
    const record = evidenceRecordPath(r.spec.repo, `flow:${r.spec.run_id}/executor.1/g1`);
    const first = r.background(build);
    const ex = await take(r, "executor.1");
    const lo = await take(r, "explorer.1", "explorer");
    expect([ex.reply, lo.reply]).toEqual(["bound", "bound"]);
    expect(existsSync(record)).toBe(true);
    // the explorer's host failure pauses the run: the executor's call is held with its record in place
    r.fake.failTurn(lo.agent, "internalServerError");
    expect(await first.done).toEqual({ state: "paused", reason: "held:explorer.1" });
    rmSync(record);
    const second = r.background(build);
    await waitFor(() => existsSync(record), 5_000);
    // restored from the evidence_placed row: no step of the call was bound again yet
    expect(of(r.rows(), "thread_started", "executor.1")).toHaveLength(1);
    const ex2 = await take(r, "executor.1");
    const lo2 = await take(r, "explorer.1", "explorer");
    expect([ex2.reply, lo2.reply]).toEqual(["bound", "bound"]);
    r.fake.answer(ex2.agent, '{"summary":"built","score":1}');
    r.fake.answer(lo2.agent, '{"summary":"looked","score":2}');
    expect(await second.done).toMatchObject({ state: "completed" });
    expect(existsSync(record)).toBe(false);
  });

  it("evidence_placed changes no reading of the call's state (S000-172)", async () => {
    run = await inProcessRun({});
    const r = run;
    r.spec.evidence = true;
    await r.execute(build, (step) =>
      step.call === "executor.1" ? json({ summary: "b", score: 1 }) : json({ summary: "l", score: 2 }),
    );
    const rows = r.rows().filter((x) => "call" in x && x.call === "executor.1");
    expect(rows.some((x) => x.type === "evidence_placed")).toBe(true);
    // at every prefix of the call's rows, the fold reads the same with or without the evidence rows
    for (let i = 1; i <= rows.length; i++) {
      const prefix = rows.slice(0, i);
      expect(foldCall(prefix)).toEqual(foldCall(prefix.filter((x) => x.type !== "evidence_placed")));
    }
  });
});

describe("evidence copies from the rows", () => {
  const at = new Date().toISOString();
  const prepared = (seq: number) =>
    ({
      seq,
      at,
      type: "prepared",
      call: "executor.1",
      op: "executor.1",
      role: "executor",
      input: { role: "executor", task: "t", schema: null },
      input_digest: "d",
      backend: "session",
      allocation: { workspace: "/p", kind: "scratch" },
    }) as unknown as JournalRow;
  const placedRow = (seq: number, cwd: string, assignment: string, attempt: number) =>
    ({
      seq,
      at,
      type: "evidence_placed",
      call: "executor.1",
      evidence_assignment: assignment,
      evidence_cwd: cwd,
      attempt,
      marker: `executor.1/t1-a${attempt}`,
    }) as unknown as JournalRow;

  it("the newest generation is the rows from the newest prepared row on; release finds every copy of every generation, restore writes the newest generation's (S000-170 S000-171)", () => {
    const root = mkdtempSync(join(tmpdir(), "crw-flow-evidence-"));
    try {
      const [a, b, c] = ["a", "b", "c"].map((d) => join(root, d)) as [string, string, string];
      const rows: JournalRow[] = [
        prepared(1),
        placedRow(2, a, "flow:r/executor.1/g1", 1),
        prepared(3), // prepared again: a new generation
        placedRow(4, b, "flow:r/executor.1/g2", 1),
        placedRow(5, c, "flow:r/executor.1/g2", 2),
      ];
      expect(newestGeneration(rows).map((x) => x.seq)).toEqual([3, 4, 5]);
      // the next spawn step of the newest generation: written under b and c before it, a ignored
      expect(stepEvidence("r", "executor.1", rows)).toEqual({
        evidence_assignment: "flow:r/executor.1/g2",
        evidence_cwds: [b, c],
        evidence_ignored: [a],
      });
      // the restore of a resumed call writes the newest generation's copies only
      const restored = restoreEvidence("r", rows);
      expect(restored.failed).toEqual([]);
      expect(restored.written.sort()).toEqual(
        [evidenceRecordPath(b, "flow:r/executor.1/g2"), evidenceRecordPath(c, "flow:r/executor.1/g2")].sort(),
      );
      // a copy the older generation left behind
      mkdirSync(join(a, ".crw", "flow-evidence"), { recursive: true });
      writeFileSync(evidenceRecordPath(a, "flow:r/executor.1/g1"), "{}");
      expect(evidenceCopies(rows).map((x) => x.cwd)).toEqual([a, b, c]);
      const released = releaseEvidence(rows);
      expect(released.sort()).toEqual(
        evidenceCopies(rows)
          .map((x) => x.path)
          .sort(),
      );
      for (const d of [a, b, c]) expect(existsSync(join(d, ".crw", "flow-evidence"))).toBe(false);
      expect(releaseEvidence(rows)).toEqual([]); // released once; again is no error
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});

async function waitFor(check: () => boolean, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error("timed out");
    await new Promise((res) => setTimeout(res, 20));
  }
}
