import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { scratchDir } from "@crw/tools/scratch";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { listStepFiles, reportName } from "../src/index.js";
import { crwFlow, ensureBuilt, waitFor } from "./helpers/cli.js";
import { defineWorkflow, type InProcessRun, inProcessRun, countSchema as schema } from "./helpers/harness.js";

/**
 * An owner that answers a refusal by doing the same again is held after a bound, with a hint that names
 * the fix, and `crw flow answer` resumes it; a host crw cannot reach is diagnosed in `next`.
 */
let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});
beforeAll(() => ensureBuilt(), 180_000);

const one = defineWorkflow({
  name: "one",
  run: (ctx) => ctx.call({ role: "explorer", task: "count", schema }),
});
const roles = { explorer: { model: "m-explore", effort: "high" } };

describe("bounded owner refusals", () => {
  it("three spawns with another pair than the role's hold the call for a decision naming the hook and the pair; answer retry resumes it, and the right pair runs it to the end", async () => {
    run = await inProcessRun({ roles });
    const r = run;
    const { done } = r.background(one);
    const step = await r.firstStep();
    const spawns: string[] = [];
    for (let i = 0; i < 3; i++) {
      const wrong = r.spawn(step, "explorer", { model: "other", reasoningEffort: "high" });
      spawns.push(wrong.threadId);
      expect(await r.report(step, wrong.threadId)).toBe("pair_mismatch");
    }
    const outcome = await done;
    const id = "refusals-explorer.1-t1-a1";
    expect(outcome).toEqual({ state: "paused", reason: `waiting_decision:${id}` });
    const rows = r.rows();
    expect(rows.find((x) => x.type === "held")).toMatchObject({
      reason: "owner_refusals",
      detail: expect.stringMatching(/^3 pair_mismatch/),
    });
    const asked = rows.find((x) => x.type === "decision_requested");
    expect(asked).toMatchObject({ decision: id, options: ["retry", "fail"] });
    expect(asked?.type === "decision_requested" && asked.question).toMatch(/crw flow hook install/);
    expect(asked?.type === "decision_requested" && asked.question).toMatch(
      /model=m-explore reasoning_effort=high/,
    );
    // the step was taken back: the owner is handed nothing to spawn again
    expect(listStepFiles(r.paths.steps).steps).toHaveLength(0);
    // next tells the owner why, and what to run
    const next = await crwFlow(["next", "run-1", "--state", join(r.root, "state"), "--json"]);
    expect(next.json()).toMatchObject({
      state: "waiting_decision",
      decision: { id, options: ["retry", "fail"] },
    });
    expect(String(next.json().hint)).toMatch(/crw flow hook install/);
    const answered = await crwFlow([
      "answer",
      "run-1",
      id,
      "retry",
      "--no-resume",
      "--state",
      join(r.root, "state"),
    ]);
    expect(answered.code, answered.stderr).toBe(0);
    // resumed: a new attempt, and the right pair binds it
    const again = r.background(one);
    const [step2] = await r.steps(1);
    if (!step2) throw new Error("no step");
    expect(step2).toMatchObject({ attempt: 2 });
    const right = r.spawn(step2, "explorer", { model: "m-explore", reasoningEffort: "high" });
    expect(await r.report(step2, right.threadId)).toBe("bound");
    r.fake.answer(right.threadId, '{"n":4}');
    expect(await again.done).toEqual({ state: "completed", result: { n: 4 } });
    expect(spawns).toHaveLength(3);
  }, 60_000);

  it("the refusal that reaches the bound is answered only after the call is held and its step taken back: an owner that asks next at once is handed nothing to spawn", async () => {
    run = await inProcessRun({ roles });
    const r = run;
    // what an owner reading each reply would find at that moment: the journal and the step files
    const seen: Array<{ reply: string; held: boolean; steps: number }> = [];
    const { done } = r.background(one, (e) => {
      if (e.type !== "reply") return;
      const held = r.rows().some((x) => x.type === "held" && x.reason === "owner_refusals");
      seen.push({ reply: e.reply, held, steps: listStepFiles(r.paths.steps).steps.length });
    });
    const step = await r.firstStep();
    let lastAgent = "";
    for (let i = 0; i < 3; i++) {
      const wrong = r.spawn(step, "explorer", { model: "other", reasoningEffort: "high" });
      lastAgent = wrong.threadId;
      expect(await r.report(step, wrong.threadId)).toBe("pair_mismatch");
    }
    expect(await done).toMatchObject({ state: "paused" });
    expect(seen).toEqual([
      { reply: "pair_mismatch", held: false, steps: 1 },
      { reply: "pair_mismatch", held: false, steps: 1 },
      { reply: "pair_mismatch", held: true, steps: 0 },
    ]);
    // the last reply itself says the call is held and nothing more is to be spawned
    const last = JSON.parse(
      readFileSync(join(r.paths.replies, reportName("explorer.1", 1, 1, lastAgent)), "utf8"),
    );
    expect(last.reason).toMatch(/the call is now held for a decision, spawn nothing more for it/);
    expect(last.reason).not.toMatch(/spawn again/);
  }, 60_000);

  it("answer fail ends the held call: the workflow sees owner_refusals", async () => {
    run = await inProcessRun({ roles });
    const r = run;
    const { done } = r.background(one);
    const step = await r.firstStep();
    for (let i = 0; i < 3; i++) {
      const wrong = r.spawn(step, "explorer", { model: "other" });
      await r.report(step, wrong.threadId);
    }
    await done;
    const id = "refusals-explorer.1-t1-a1";
    expect(
      (await crwFlow(["answer", "run-1", id, "fail", "--no-resume", "--state", join(r.root, "state")])).code,
    ).toBe(0);
    const again = await r.background(one).done;
    expect(again).toMatchObject({
      state: "failed",
      error: expect.stringMatching(/ended null_model: owner_refusals/),
    });
  }, 60_000);

  it("a run started with --refusal-bound 1 holds at the first refusal", async () => {
    run = await inProcessRun({ roles });
    const r = run;
    // the run's spec as `--refusal-bound 1` writes it
    r.spec.refusal_bound = 1;
    writeFileSync(r.paths.spec, JSON.stringify(r.spec));
    const { done } = r.background(one);
    const step = await r.firstStep();
    const wrong = r.spawn(step, "explorer", { model: "other" });
    expect(await r.report(step, wrong.threadId)).toBe("pair_mismatch");
    expect(await done).toMatchObject({ state: "paused" });
  }, 60_000);
});

describe("a host crw cannot reach", () => {
  it("after the bound of failed connects the journal says why, dispatched and next tell the owner what to do, and an owner that keeps reporting is held", async () => {
    run = await inProcessRun({ roles });
    const r = run;
    // the run's spec as `--refusal-bound 1` writes it
    r.spec.refusal_bound = 1;
    writeFileSync(r.paths.spec, JSON.stringify(r.spec));
    const { done } = r.background(one);
    const step = await r.firstStep();
    const agent = r.spawn(step, "explorer", { model: "m-explore", reasoningEffort: "high" });
    // the owner's host goes away while the step waits: every lookup fails to connect
    await r.fake.stop();
    await waitFor(
      "the host_unreachable warning",
      () => r.rows().find((x) => x.type === "flow_warning" && x.warning === "host_unreachable"),
      30_000,
    );
    const warning = r.rows().find((x) => x.type === "flow_warning" && x.warning === "host_unreachable");
    expect(warning?.type === "flow_warning" && warning.detail).toMatchObject({
      host: r.spec.host,
      why: expect.stringMatching(/nothing listens at ws:\/\/127\.0\.0\.1:\d+: connection refused/),
      fix: expect.stringMatching(/--listen ws:\/\/127\.0\.0\.1:PORT/),
    });
    const next = await crwFlow(["next", "run-1", "--state", join(r.root, "state"), "--json"]);
    expect(next.json()).toMatchObject({ host: { reachable: false, host: r.spec.host } });
    expect(String(next.json().hint)).toMatch(/^crw cannot reach the owner's Codex host/);
    // the owner's reports are answered retry with the diagnosis; five of them (the bound of 1, times 5) hold
    for (let i = 0; i < 5; i++) expect(await r.report(step, agent.threadId)).toBe("retry");
    const reply = JSON.parse(
      readFileSync(join(r.paths.replies, reportName(step.call, 1, 1, agent.threadId)), "utf8"),
    );
    expect(reply.reason).toMatch(/^crw cannot reach the owner's Codex host .*To fix: /);
    expect(await done).toMatchObject({
      state: "paused",
      reason: "waiting_decision:refusals-explorer.1-t1-a1",
    });
    const asked = r.rows().find((x) => x.type === "decision_requested");
    expect(asked?.type === "decision_requested" && asked.question).toMatch(
      /cannot reach the owner's Codex host/,
    );
  }, 60_000);

  it("the start's seventh fact warns of a host with no control socket", async () => {
    const { ownerHostReachable } = await import("../src/cli/sessionFacts.js");
    const home = scratchDir("crw-codex-home-");
    const previous = process.env.CODEX_HOME;
    process.env.CODEX_HOME = home;
    try {
      const fact = await ownerHostReachable("");
      expect(fact).toMatchObject({ fact: "owner_host_reachable", ok: false });
      expect(fact.detail).toContain(join(home, "app-server-control", "app-server-control.sock"));
      expect(fact.detail).toMatch(/run the owner in the Codex CLI/);
      expect(await ownerHostReachable("ws://127.0.0.1:9")).toMatchObject({ ok: false });
    } finally {
      if (previous === undefined) delete process.env.CODEX_HOME;
      else process.env.CODEX_HOME = previous;
    }
  });
});
