import { execFileSync } from "node:child_process";
import { appendFileSync, existsSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { executeRun, type FlowError, type JournalRow } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import {
  answerSchema,
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  rowsOfType,
  countSchema as schema,
  until,
} from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const one = (task = "count") =>
  defineWorkflow({ name: "one", run: (ctx) => ctx.call({ role: "explorer", task, schema }) });

/** Two calls one after the other: the first one's answer is in the second one's task. */
const two = defineWorkflow({
  name: "two",
  run: async (ctx) => {
    const a = await ctx.call({ role: "explorer", task: "first", schema });
    const b = await ctx.call({ role: "explorer", task: `second after ${JSON.stringify(a)}`, schema });
    return [a, b];
  },
});

const preparedOf = (r: InProcessRun, call: string) =>
  r
    .rows()
    .find((x): x is Extract<JournalRow, { type: "prepared" }> => x.type === "prepared" && x.call === call);

const published = (r: InProcessRun) => rowsOfType(r.rows(), "step_published");

/** The owner takes the step of `call` numbered `attempt`: spawns its subagent and reports it. */
async function bind(r: InProcessRun, call: string, attempt: number, role = "explorer") {
  await until(`the step of ${call} a${attempt}`, () =>
    published(r).some((s) => "call" in s && s.call === call && "attempt" in s && s.attempt === attempt),
  );
  const step = (await r.steps()).find((s) => s.call === call && s.attempt === attempt);
  if (!step) throw new Error(`no step of ${call} a${attempt}`);
  const agent = r.spawn(step, role);
  expect(await r.report(step, agent.threadId)).toBe("bound");
  return agent.threadId;
}

describe("a resumed process takes its calls up where the journal left them", () => {
  it("a prepared call whose scratch workspace was removed has it made again before its next attempt", async () => {
    run = await inProcessRun();
    const r = run;
    const first = r.background(one());
    r.fake.failTurn(await bind(r, "explorer.1", 1), "internalServerError");
    expect(await first.done).toEqual({ state: "paused", reason: "held:explorer.1" });
    const workspace = preparedOf(r, "explorer.1")?.allocation.workspace as string;
    expect(existsSync(workspace)).toBe(true);
    rmSync(workspace, { recursive: true, force: true });
    const second = r.background(one());
    const agent = await bind(r, "explorer.1", 2);
    expect(existsSync(workspace)).toBe(true);
    r.fake.answer(agent, '{"n":3}');
    expect(await second.done).toEqual({ state: "completed", result: { n: 3 } });
    expect(rowsOfType(r.rows(), "prepared")).toHaveLength(1);
  });

  it("an ended call is answered from its rows at a resume: its workspace is not made again", async () => {
    run = await inProcessRun();
    const r = run;
    const first = r.background(two);
    r.fake.answer(await bind(r, "explorer.1", 1), '{"n":1}');
    r.fake.failTurn(await bind(r, "explorer.2", 1), "internalServerError");
    expect(await first.done).toEqual({ state: "paused", reason: "held:explorer.2" });
    const ended = preparedOf(r, "explorer.1")?.allocation.workspace as string;
    rmSync(ended, { recursive: true, force: true });
    const second = r.background(two);
    r.fake.answer(await bind(r, "explorer.2", 2), '{"n":2}');
    expect(await second.done).toEqual({ state: "completed", result: [{ n: 1 }, { n: 2 }] });
    expect(existsSync(ended)).toBe(false);
    // the ended call got no second step and no second terminal row
    expect(rowsOfType(r.rows(), "completed").map((x) => ("call" in x ? x.call : ""))).toEqual([
      "explorer.1",
      "explorer.2",
    ]);
  });

  it("a resume whose call input changed names the op in the error and stops the run for that op", async () => {
    run = await inProcessRun();
    const r = run;
    const first = r.background(one());
    r.fake.failTurn(await bind(r, "explorer.1", 1), "internalServerError");
    await first.done;
    const changed = r.background(one("count differently"));
    const err = (await changed.done.catch((e: unknown) => e)) as FlowError;
    expect(err.code).toBe("digest_mismatch");
    expect(err.context).toEqual({ op: "explorer.1" });
    expect(changed.events).toContainEqual({ type: "stopping", reason: "digest_mismatch:explorer.1" });
  });

  it("a torn last line of an ended run's journal is cut off even when nobody listens to the warning", async () => {
    run = await inProcessRun();
    const r = run;
    const first = r.background(one());
    r.fake.answer(await bind(r, "explorer.1", 1), '{"n":7}');
    expect(await first.done).toEqual({ state: "completed", result: { n: 7 } });
    appendFileSync(r.paths.journal, '{"seq":99,"at":"x","type":"run_pa');
    const again = await executeRun({
      paths: r.paths,
      spec: r.spec,
      host: r.host,
      processToken: null,
      workflow: one(),
    });
    expect(again).toEqual({ state: "completed", result: { n: 7 } });
    expect(r.rows().at(-1)?.type).toBe("run_ended");
  });
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

describe("a resumed call in a git checkout", () => {
  it("a prepared call whose worktree was removed gets it back at its start commit", async () => {
    run = await inProcessRun();
    const r = run;
    const repo = r.spec.repo;
    sh(repo, "init", "-q", "-b", "main");
    writeFileSync(join(repo, "a.txt"), "a\n");
    sh(repo, "add", "-A");
    sh(repo, "commit", "-q", "-m", "start");
    const start = sh(repo, "rev-parse", "HEAD");
    const exec = defineWorkflow({
      name: "exec",
      run: (ctx) => ctx.call({ role: "executor", task: "change a", schema: answerSchema }),
    });
    const first = r.background(exec);
    r.fake.failTurn(await bind(r, "executor.1", 1, "executor"), "internalServerError");
    expect(await first.done).toEqual({ state: "paused", reason: "held:executor.1" });
    const allocation = preparedOf(r, "executor.1")?.allocation;
    expect(allocation).toMatchObject({ kind: "worktree", start });
    const wt = String(allocation?.workspace);
    sh(repo, "worktree", "remove", "--force", wt);
    expect(existsSync(wt)).toBe(false);
    const second = r.background(exec);
    const agent = await bind(r, "executor.1", 2, "executor");
    expect(existsSync(join(wt, "a.txt"))).toBe(true);
    expect(sh(wt, "rev-parse", "HEAD")).toBe(start);
    r.fake.answer(agent, '{"summary":"s","score":1}');
    expect(await second.done).toMatchObject({ state: "completed" });
  });
});
