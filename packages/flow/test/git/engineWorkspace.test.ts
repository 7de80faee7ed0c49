import { execFileSync } from "node:child_process";
import { existsSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type JournalRow, shadowReplay } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import { answerSchema, defineWorkflow, type InProcessRun, inProcessRun, until } from "../helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const gitEnv = {
  ...process.env,
  GIT_AUTHOR_NAME: "t",
  GIT_AUTHOR_EMAIL: "t@t",
  GIT_COMMITTER_NAME: "t",
  GIT_COMMITTER_EMAIL: "t@t",
};
const sh = (cwd: string, ...args: string[]) =>
  execFileSync("git", args, { cwd, env: gitEnv, encoding: "utf8" }).trim();

/** The run's repository made a git checkout with one commit. */
function gitRepo(r: InProcessRun): string {
  const repo = r.spec.repo;
  rmSync(join(repo, ".crw"), { recursive: true, force: true });
  sh(repo, "init", "-q", "-b", "main");
  writeFileSync(join(repo, "a.txt"), "a\n");
  sh(repo, "add", "-A");
  sh(repo, "commit", "-q", "-m", "start");
  return sh(repo, "rev-parse", "HEAD");
}

const prepared = (r: InProcessRun, call: string) =>
  r
    .rows()
    .find((x): x is Extract<JournalRow, { type: "prepared" }> => x.type === "prepared" && x.call === call);

async function answer(r: InProcessRun, call: string, role: string) {
  const steps = await r.steps(1);
  const step = steps.find((s) => s.call === call);
  if (!step) throw new Error(`no step of ${call}`);
  const agent = r.spawn(step, role);
  expect(await r.report(step, agent.threadId)).toBe("bound");
  return agent.threadId;
}

describe("git workspaces of the engine's calls", () => {
  it("an executor call's P is its own worktree at HEAD, where its step sends the subagent; a subagent's commit is kept on the stray ref and the completed row records executor_head_moved from the allocation's start (S000-010 S000-122 S000-118)", async () => {
    run = await inProcessRun({});
    const r = run;
    const start = gitRepo(r);
    const wf = defineWorkflow({
      name: "exec",
      run: async (ctx) => ctx.call({ role: "executor", task: "change a", schema: answerSchema }),
    });
    const { done } = r.background(wf);
    const [step] = await r.steps(1);
    const p = prepared(r, "executor.1");
    expect(p?.allocation).toMatchObject({ kind: "worktree", start });
    const wt = String(p?.allocation.workspace);
    expect(existsSync(join(wt, "a.txt"))).toBe(true);
    expect(sh(wt, "rev-parse", "HEAD")).toBe(start);
    expect(sh(wt, "rev-parse", "--git-common-dir")).toBe(join(r.spec.repo, ".git"));
    // the subagent is sent to work there: the step, its row and its message name the worktree
    expect(step?.workspace).toBe(wt);
    expect(step?.message).toContain(wt);
    expect(r.rows().find((x) => x.type === "step_published")).toMatchObject({ workspace: wt });
    // the subagent commits on its own (which it should not): HEAD moves
    writeFileSync(join(wt, "a.txt"), "changed\n");
    sh(wt, "commit", "-q", "-am", "stray");
    const head = sh(wt, "rev-parse", "HEAD");
    const agent = await answer(r, "executor.1", "executor");
    expect(r.rows().find((x) => x.type === "thread_started")).toMatchObject({ cwd: wt });
    r.fake.answer(agent, '{"summary":"s","score":1}');
    expect(await done).toMatchObject({ state: "completed" });
    const completed = r.rows().find((x) => x.type === "completed");
    const ref = `refs/crw/flow/${r.spec.run_id}/stray/executor/a1-executor.1`;
    expect(completed).toMatchObject({ executor_head_moved: { start, head, ref } });
    expect(sh(r.spec.repo, "rev-parse", ref)).toBe(head);
  });

  it("around a session call's turns the engine keeps the whole call machinery: prepared row and worktree, the gate's evidence record, one schema repair, the terminal row with the pending tree and its proof (S000-004)", async () => {
    run = await inProcessRun({});
    const r = run;
    r.spec.evidence = true;
    const start = gitRepo(r);
    const wf = defineWorkflow({
      name: "machinery",
      run: async (ctx) => ctx.call({ role: "executor", task: "write b", schema: answerSchema }),
    });
    const { done } = r.background(wf);
    // the owner's part is only to spawn a subagent for each step and report it
    const [first] = await r.steps(1);
    if (!first) throw new Error("no first step");
    const p = prepared(r, "executor.1");
    expect(p?.allocation).toMatchObject({ kind: "worktree", start });
    const types = () => r.rows().map((x) => x.type);
    expect(types().indexOf("prepared")).toBeLessThan(types().indexOf("step_published"));
    const wt = String(p?.allocation.workspace);
    writeFileSync(join(wt, "b.txt"), "b\n");
    const a = r.spawn(first, "executor");
    expect(await r.report(first, a.threadId)).toBe("bound");
    // the gate: the executor's bind placed its evidence record before its thread_started row
    expect(types().indexOf("evidence_placed")).toBeGreaterThan(-1);
    expect(types().indexOf("evidence_placed")).toBeLessThan(types().indexOf("thread_started"));
    // an answer the schema refuses: the engine asks for one repair
    r.fake.answer(a.threadId, '{"summary":"no score"}');
    const repair = (await r.steps(1)).find((s) => s.k === 2);
    if (!repair) throw new Error("no repair step");
    // the repair goes to the same subagent (send_input)
    expect(repair).toMatchObject({ action: "send_input", agent_id: a.threadId });
    r.fake.sendInput(a.threadId, repair.message);
    expect(await r.report(repair, a.threadId)).toBe("bound");
    r.fake.answer(a.threadId, '{"summary":"wrote b","score":1}');
    expect(await done).toMatchObject({ state: "completed" });
    const published = r.rows().filter((x) => x.type === "step_published");
    expect(published.map((x) => x.k)).toEqual([1, 2]);
    expect(published[1]).toMatchObject({ repair: { answer: '{"summary":"no score"}' } });
    const ended = r.rows().filter((x) => x.type === "completed" || x.type === "null_model");
    expect(ended).toHaveLength(1);
    const completed = ended[0] as Extract<JournalRow, { type: "completed" }>;
    expect(completed).toMatchObject({ call: "executor.1", k: 2, result: { summary: "wrote b", score: 1 } });
    // the pending tree P left (b.txt in it), proven as the call's state, and the work committed from it
    const tree = String(completed.executor_state?.pending_tree);
    expect(sh(r.spec.repo, "ls-tree", "--name-only", tree)).toContain("b.txt");
    expect(completed.executor_state?.stray_head).toBeNull();
    expect(completed.work?.paths).toEqual(["b.txt"]);
    expect(sh(r.spec.repo, "rev-parse", `${completed.work?.commit}^{tree}`)).toBe(tree);
  });

  it("the schema validation gets one repair only: a repair answer the schema refuses again ends the call null_model, with no third turn (S000-004)", async () => {
    run = await inProcessRun({});
    const wf = defineWorkflow({
      name: "twice",
      run: async (ctx) =>
        ctx.call({ role: "explorer", task: "answer", schema: answerSchema }).then(
          () => "answered",
          () => "failed",
        ),
    });
    const { outcome } = await run.execute(wf, () => ({
      kind: "answer",
      messages: [{ text: '{"summary":"no score"}', phase: "final_answer" }],
    }));
    expect(outcome).toEqual({ state: "completed", result: "failed" });
    const rows = run.rows();
    expect(rows.filter((x) => x.type === "step_published").map((x) => x.k)).toEqual([1, 2]);
    expect(rows.filter((x) => x.type === "null_model")).toEqual([
      expect.objectContaining({ call: "explorer.1", reason: "answer_invalid_after_repair" }),
    ]);
    expect(rows.some((x) => x.type === "completed")).toBe(false);
  });

  it("the proof takes the recorded stray HEAD whose tree is the pending tree as the call's state; a pending tree no stray HEAD has is its own state (S000-124)", async () => {
    run = await inProcessRun({});
    const r = run;
    gitRepo(r);
    const wf = defineWorkflow({
      name: "proof",
      run: async (ctx) => {
        const a = await ctx.call({ role: "executor", node: "clean", task: "commit a", schema: answerSchema });
        const b = await ctx.call({ role: "executor", node: "dirty", task: "commit b", schema: answerSchema });
        return [a, b];
      },
    });
    const { done } = r.background(wf);
    // clean.1: the subagent commits everything: its pending tree is its stray HEAD's tree
    await r.steps(1);
    const wtA = String(prepared(r, "clean.1")?.allocation.workspace);
    writeFileSync(join(wtA, "a.txt"), "committed\n");
    sh(wtA, "commit", "-q", "-am", "stray");
    const headA = sh(wtA, "rev-parse", "HEAD");
    const agentA = await answer(r, "clean.1", "executor");
    r.fake.answer(agentA, '{"summary":"s","score":1}');
    // dirty.1: the subagent commits, then changes more: no stray HEAD has its pending tree
    await waitForCall(r, "dirty.1");
    const wtB = String(prepared(r, "dirty.1")?.allocation.workspace);
    // dirty.1 starts from clean.1's commit (the run branch's tip): its own change is another content
    writeFileSync(join(wtB, "a.txt"), "committed again\n");
    sh(wtB, "commit", "-q", "-am", "stray");
    writeFileSync(join(wtB, "new.txt"), "not committed\n");
    const agentB = await answer(r, "dirty.1", "executor");
    r.fake.answer(agentB, '{"summary":"s","score":2}');
    expect(await done).toMatchObject({ state: "completed" });
    const completed = (call: string) =>
      r
        .rows()
        .find(
          (x): x is Extract<JournalRow, { type: "completed" }> => x.type === "completed" && x.call === call,
        );
    expect(completed("clean.1")?.executor_state).toEqual({
      pending_tree: sh(r.spec.repo, "rev-parse", `${headA}^{tree}`),
      stray_head: headA,
    });
    const stateB = completed("dirty.1")?.executor_state;
    expect(stateB?.stray_head).toBeNull();
    expect(stateB?.pending_tree).not.toBe(
      sh(r.spec.repo, "rev-parse", `${completed("dirty.1")?.executor_head_moved?.head}^{tree}`),
    );
    // the pending tree holds the uncommitted file
    expect(sh(r.spec.repo, "ls-tree", "--name-only", String(stateB?.pending_tree))).toContain("new.txt");
  });

  it("an executor call's pending tree is read from its P, never from the run's checkout", async () => {
    run = await inProcessRun({});
    const r = run;
    gitRepo(r);
    const wf = defineWorkflow({
      name: "pending",
      run: async (ctx) => ctx.call({ role: "executor", task: "change a", schema: answerSchema }),
    });
    const { done } = r.background(wf);
    await r.steps(1);
    const wt = String(prepared(r, "executor.1")?.allocation.workspace);
    expect(wt).not.toBe(r.spec.repo);
    // Uncommitted work in P, and other uncommitted work in the run's checkout (the owner's cwd).
    writeFileSync(join(wt, "a.txt"), "changed in P\n");
    writeFileSync(join(wt, "in-p.txt"), "P\n");
    writeFileSync(join(r.spec.repo, "in-checkout.txt"), "checkout\n");
    const agent = await answer(r, "executor.1", "executor");
    r.fake.answer(agent, '{"summary":"s","score":1}');
    expect(await done).toMatchObject({ state: "completed" });
    const completed = r
      .rows()
      .find(
        (x): x is Extract<JournalRow, { type: "completed" }> =>
          x.type === "completed" && x.call === "executor.1",
      );
    const tree = String(completed?.executor_state?.pending_tree);
    const names = sh(r.spec.repo, "ls-tree", "--name-only", tree).split("\n");
    expect(names).toContain("in-p.txt");
    expect(names).not.toContain("in-checkout.txt");
    expect(sh(r.spec.repo, "cat-file", "-p", `${tree}:a.txt`)).toBe("changed in P");
  });

  it("a non-executor call's P is a call-private checkout at the run branch's tip: two parallel reviewers after an executor's commit each get their own; no executor_head_moved for them (S000-011)", async () => {
    run = await inProcessRun({});
    const r = run;
    const start = gitRepo(r);
    const wf = defineWorkflow({
      name: "read",
      run: async (ctx) => {
        await ctx.call({ role: "executor", task: "write b", schema: answerSchema });
        return Promise.all([
          ctx.call({ role: "reviewer", task: "read b", schema: answerSchema }),
          ctx.call({ role: "reviewer", task: "read b again", schema: answerSchema }),
        ]);
      },
    });
    const { done } = r.background(wf);
    await r.steps(1);
    writeFileSync(join(String(prepared(r, "executor.1")?.allocation.workspace), "b.txt"), "b\n");
    r.fake.answer(await answer(r, "executor.1", "executor"), '{"summary":"s","score":1}');
    await waitForCall(r, "reviewer.2");
    // the executor's work is on the run branch: its tip is the head the readers start at
    const tip = sh(r.spec.repo, "rev-parse", `crw/flow/${r.spec.run_id}`);
    expect(tip).not.toBe(start);
    const wts = ["reviewer.1", "reviewer.2"].map((call) => {
      const p = prepared(r, call);
      expect(p?.allocation).toMatchObject({ kind: "worktree", start: tip });
      const wt = String(p?.allocation.workspace);
      expect(sh(wt, "rev-parse", "HEAD")).toBe(tip);
      expect(existsSync(join(wt, "b.txt"))).toBe(true);
      return wt;
    });
    expect(new Set([...wts, r.spec.repo, String(prepared(r, "executor.1")?.allocation.workspace)]).size).toBe(
      4,
    );
    for (const call of ["reviewer.1", "reviewer.2"])
      r.fake.answer(await answer(r, call, "reviewer"), '{"summary":"s","score":1}');
    expect(await done).toMatchObject({ state: "completed" });
    for (const call of ["reviewer.1", "reviewer.2"])
      expect(r.rows().find((x) => x.type === "completed" && x.call === call)).not.toHaveProperty(
        "executor_head_moved",
      );
  });

  it("with Trace the run digests P, the owner's checkout and the shared state at bind and harvest; a read role that wrote, an executor that wrote outside P and a changed shared state are warned about, never refused (S000-114 S000-113)", async () => {
    run = await inProcessRun({});
    const r = run;
    gitRepo(r);
    r.spec.trace = true;
    const wf = defineWorkflow({
      name: "traced",
      run: async (ctx) => {
        const a = await ctx.call({ role: "reviewer", task: "read", schema: answerSchema });
        const b = await ctx.call({ role: "executor", task: "write", schema: answerSchema });
        return [a, b];
      },
    });
    const { done } = r.background(wf);
    const reviewer = await answer(r, "reviewer.1", "reviewer");
    await bindDigests(r, "reviewer.1");
    writeFileSync(join(String(prepared(r, "reviewer.1")?.allocation.workspace), "note.txt"), "x\n");
    r.fake.answer(reviewer, '{"summary":"s","score":1}');
    await waitForCall(r, "executor.1");
    const executor = await answer(r, "executor.1", "executor");
    await bindDigests(r, "executor.1");
    writeFileSync(join(r.spec.repo, "outside.txt"), "y\n"); // the owner's checkout, outside P
    sh(r.spec.repo, "update-ref", "refs/crw/other/x", "HEAD"); // shared state
    r.fake.answer(executor, '{"summary":"s","score":2}');
    expect(await done).toMatchObject({ state: "completed" });
    const warnings = r.rows().filter((x) => x.type === "flow_warning");
    expect(warnings).toContainEqual(
      expect.objectContaining({
        warning: "read_role_wrote",
        call: "reviewer.1",
        detail: expect.objectContaining({ changed: ["workspace"] }),
      }),
    );
    expect(warnings).toContainEqual(
      expect.objectContaining({ warning: "executor_wrote_outside", call: "executor.1" }),
    );
    expect(warnings).toContainEqual(
      expect.objectContaining({ warning: "shared_state_changed", call: "executor.1" }),
    );
    expect(
      warnings.filter((w) => w.call === "reviewer.1").map((w) => (w as { warning: string }).warning),
    ).toEqual(["read_role_wrote"]);
    // the digests are rows (bind, then harvest) and crw flow shadow judges them again
    const rows = r.rows();
    for (const call of ["reviewer.1", "executor.1"]) {
      expect(
        rows
          .filter((x) => x.type === "trace_digests" && x.call === call)
          .map((x) => (x as { point: string }).point),
      ).toEqual(["bind", "harvest"]);
    }
    const replayed = await shadowReplay(r.spec.run_id, wf, null, rows);
    expect(replayed).toMatchObject({ divergences: [], trace_calls_replayed: 2 });
    // a journal whose warnings do not follow from its digests diverges at the call
    const dropped = rows.filter(
      (x) => !(x.type === "flow_warning" && x.call === "reviewer.1" && x.warning === "read_role_wrote"),
    );
    const report = await shadowReplay(r.spec.run_id, wf, null, dropped);
    expect(report.divergences).toEqual([
      expect.objectContaining({ kind: "trace_warnings_differ", op: "reviewer.1" }),
    ]);
    expect(report.divergences[0]?.detail).toContain("read_role_wrote:workspace");
  });
});

async function waitForCall(r: InProcessRun, call: string) {
  const deadline = Date.now() + 10_000;
  while (!r.rows().some((x) => x.type === "step_published" && x.call === call)) {
    if (Date.now() > deadline) throw new Error(`no step of ${call}`);
    await new Promise((res) => setTimeout(res, 20));
  }
}

/** Waits for the digests the call's bind took (the trace's "before"). */
function bindDigests(r: InProcessRun, call: string) {
  return until(`${call}'s bind digests`, () =>
    r.rows().some((x) => x.type === "trace_digests" && x.call === call && x.point === "bind"),
  );
}
