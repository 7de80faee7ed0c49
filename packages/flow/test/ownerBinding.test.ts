import { execFile, spawn } from "node:child_process";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  unlinkSync,
  utimesSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import {
  bindingFile,
  bindRunOwner,
  closeRunOwner,
  FileStepBus,
  JournalWriter,
  lockHolder,
  pidAlive,
  readBinding,
  readJournalFile,
  readRoleTable,
  rolePairs,
  runPaths,
  SPEC_FORMAT,
  spawnMessage,
  tryLock,
  unlock,
  writeSpec,
} from "@crw/flow";
import { FakeAppServer } from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureBoundDir } from "../src/bound/store.js";
import { cliRoot, crwBin, crwFlow, waitFor } from "./helpers/cli.js";
import { answerSchema, defineWorkflow, inProcessRun, nullRolePairs as undecided } from "./helpers/harness.js";

let root: string;
let env: NodeJS.ProcessEnv;
let n = 0;

beforeAll(() => {
  ({ root, env } = cliRoot("crw-flow-owner-", { CRW_FLOW_STARTING_MS: "400" }));
  delete env.CRW_FLOW_FAULT;
}, 120_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

const lines = (state: string, owner: string): Array<Record<string, unknown>> => {
  const path = bindingFile(state, owner);
  if (!existsSync(path)) return [];
  return readFileSync(path, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown>);
};

/** A run held by this test process (its process lock and run lock), with its started row written. */
function heldRun(opts: { digest?: string } = {}) {
  const runId = `own-${n++}`;
  const owner = `owner-${runId}`;
  const state = join(root, "state");
  const paths = runPaths(state, runId);
  mkdirSync(paths.dir, { recursive: true });
  writeSpec(paths.spec, {
    format: SPEC_FORMAT,
    run_id: runId,
    workflow: join(root, "w.mjs"),
    workflow_name: "w",
    input: null,
    backend: "session",
    owner,
    pool: 2,
    repo: root,
    host: "ws://127.0.0.1:9",
    created_at: new Date().toISOString(),
  });
  const token = n.toString(16).padStart(12, "0");
  tryLock(join(paths.dir, `process.${token}.lock`), { pid: process.pid, token });
  tryLock(paths.runLock, { pid: process.pid, token });
  const w = JournalWriter.create(paths.journal, runId);
  const digest = opts.digest ?? readRoleTable(root).policy_digest;
  w.append([
    {
      type: "started",
      backend: "session",
      role_pairs: undecided,
      policy_digest: digest,
      process: token,
      pid: process.pid,
      process_n: 1,
    },
  ]);
  return { runId, owner, state, paths, w, digest };
}

const next = (runId: string, state: string, e = env) =>
  crwFlow(["next", runId, "--state", state, "--json"], e);

describe("the holder binds and closes the owner's line", () => {
  it("the run's process writes the line right after its started row with the pinned pairs, and closes it when the run ends (S000-211 S000-261 S000-262)", async () => {
    const run = await inProcessRun({
      roles: { explorer: { model: "m-x", effort: "low" }, reviewer: { model: "m-r" } },
    });
    try {
      const wf = defineWorkflow({
        name: "bound",
        run: async (ctx) => ctx.call({ role: "explorer", task: "one", schema: answerSchema }),
      });
      const { done } = run.background(wf);
      await run.steps(1);
      const state = run.paths.state;
      const [line, ...rest] = lines(state, run.owner);
      const started = run.rows().find((r) => r.type === "started");
      if (started?.type !== "started") throw new Error("no started row");
      expect(rest).toEqual([]);
      expect(line).toMatchObject({
        kind: "orchestrator",
        run_id: run.spec.run_id,
        policyDigest: started.policy_digest,
        helperPairs: {
          explorer: { model: "m-x", effort: "low" },
          reviewer: { model: "m-r" },
          architect: {},
        },
      });
      expect(Date.parse(String(line?.at))).toBeGreaterThanOrEqual(Date.parse(started.at));
      const [step] = await run.steps(1);
      if (!step) throw new Error("no step");
      const agent = run.spawn(step, "explorer", { model: "m-x", reasoningEffort: "low" }).threadId;
      expect(await run.report(step, agent)).toBe("bound");
      run.fake.answer(agent, '{"summary":"s","score":1}');
      const outcome = await done;
      expect(outcome.state).toBe("completed");
      const after = lines(state, run.owner);
      expect(after.map((l) => l.kind)).toEqual(["orchestrator", "closed"]);
      expect(after[1]).toMatchObject({ run_id: run.spec.run_id });
      expect(readBinding(state, run.owner).line).toBeNull();
    } finally {
      await run.close();
    }
  });
});

describe("a resume in the foreground", () => {
  it("binds the owner thread while it runs and closes its line when the run ends (S000-237)", async () => {
    const run = await inProcessRun();
    try {
      const wf = defineWorkflow({
        name: "again",
        run: async (ctx) => ctx.call({ role: "explorer", task: "one", schema: answerSchema }),
      });
      // the first process: the host fails the turn, the call is held and the run pauses (no close)
      const first = await run.execute(wf, () => ({ kind: "fail", codexErrorInfo: "internalServerError" }));
      expect(first.outcome.state).toBe("paused");
      const state = run.paths.state;
      const atPause = lines(state, run.owner);
      closeRunOwner({ state, owner: run.owner, runId: run.spec.run_id });
      const closed = lines(state, run.owner).length;
      // the resume (executeRun in this process, as `crw flow resume RUN` runs it) binds, then closes at the end
      let boundWhileRunning: unknown = null;
      const second = await run.execute(wf, () => {
        boundWhileRunning ??= readBinding(state, run.owner).line;
        return { kind: "answer", messages: [{ text: '{"summary":"s","score":1}', phase: "final_answer" }] };
      });
      expect(second.outcome.state).toBe("completed");
      expect(atPause.at(-1)).toMatchObject({ kind: "orchestrator" });
      expect(boundWhileRunning).toMatchObject({ kind: "orchestrator", run_id: run.spec.run_id });
      expect(
        lines(state, run.owner)
          .slice(closed)
          .map((l) => l.kind),
      ).toEqual(["orchestrator", "closed"]);
      expect(readBinding(state, run.owner).line).toBeNull();
    } finally {
      await run.close();
    }
  });
});

describe("crw flow start binds the owner; a resume binds again", () => {
  let fake: FakeAppServer;
  let cliEnv: NodeJS.ProcessEnv;
  const wfPath = () => {
    const path = join(root, "one.mjs");
    writeFileSync(
      path,
      `export default { name: "one", async run(ctx) { return ctx.call({ role: "explorer", task: "one" }); } };`,
    );
    return path;
  };
  beforeAll(async () => {
    fake = await FakeAppServer.start();
    cliEnv = { ...env, CRW_FLOW_HOST: fake.url };
  });
  afterAll(async () => {
    await fake?.stop();
  });
  const start = (runId: string, owner: string, state: string, e = cliEnv) =>
    crwFlow(
      ["start", wfPath(), "--run", runId, "--owner", owner, "--state", state, "--poll-ms", "20", "--json"],
      e,
      root,
    );
  const startedRows = (state: string, runId: string) =>
    existsSync(runPaths(state, runId).journal)
      ? readJournalFile(runPaths(state, runId).journal).rows.filter((r) => r.type === "started")
      : [];

  describe("a start from an owner thread no other run is bound to", () => {
    let state: string;
    let owner: string;
    let a: Record<string, unknown>;
    let pid: number;
    let started: ReturnType<typeof startedRows>[number] | undefined;
    let linesAtStarted: Array<Record<string, unknown>>;
    let linesLater: Array<Record<string, unknown>>;
    let processLockAt: number;
    let aliveAfterStart: boolean;

    beforeAll(async () => {
      state = join(root, "cli-state-1");
      owner = fake.createOwnerThread({ cwd: root });
      const r = await start("cli-bind", owner, state);
      expect(r.code, r.stderr).toBe(0);
      a = r.json();
      pid = Number(a.pid);
      aliveAfterStart = pidAlive(pid);
      try {
        [started] = await waitFor("started row", () => {
          const s = startedRows(state, "cli-bind");
          return s.length > 0 ? s : null;
        });
        linesAtStarted = lines(state, owner);
        const token = (started as { process: string }).process;
        processLockAt = statSync(join(runPaths(state, "cli-bind").dir, `process.${token}.lock`)).mtimeMs;
        // the holder has taken the line for its own by now, or never does
        await new Promise((res) => setTimeout(res, 1_000));
        linesLater = lines(state, owner);
      } finally {
        process.kill(pid, "SIGKILL");
      }
    }, 60_000);

    it("the owner thread is bound to the run by the start itself, not by the run's process (S000-194)", () => {
      expect(linesAtStarted[0]).toMatchObject({ kind: "orchestrator", run_id: "cli-bind" });
      expect(linesAtStarted[0]?.pid).not.toBe(pid);
      expect(readBinding(state, owner).line).toMatchObject({ run_id: "cli-bind" });
    });

    it("the start writes the orchestrator line before the run's process takes its process lock or writes its started row (S000-259)", () => {
      const at = Date.parse(String(linesAtStarted[0]?.at));
      expect(at).toBeLessThanOrEqual(Math.ceil(processLockAt));
      expect(at).toBeLessThanOrEqual(Date.parse(String(started?.at)));
    });

    it("the holder finds the last line its own (its pinned table) and writes it no more (S000-261)", () => {
      expect(linesLater).toHaveLength(1);
      expect(linesLater[0]).toMatchObject({
        policyDigest: (started as { policy_digest: string }).policy_digest,
      });
    });

    it("owner_bound holds: a thread id, a binding that reads back, no other live run (S000-307)", () => {
      expect(a.facts).toContainEqual({
        fact: "owner_bound",
        ok: true,
        detail: `owner thread ${owner} is bound to the run`,
      });
    });

    it("a failing fact is a warning only: the run's process lives (S000-306)", () => {
      const facts = a.facts as Array<{ fact: string; ok: boolean }>;
      expect(facts.some((f) => !f.ok)).toBe(true);
      expect(aliveAfterStart).toBe(true);
      expect(started).toBeDefined();
    });
  });

  it("the holder's line comes only after its started row: a process SIGKILLed right after that row has written no line (S000-211)", async () => {
    const state = join(root, "cli-state-211");
    const owner = fake.createOwnerThread({ cwd: root });
    const r = await start("cli-order", owner, state);
    expect(r.code, r.stderr).toBe(0);
    const pid = Number(r.json().pid);
    await waitFor("started row", () => startedRows(state, "cli-order").length === 1);
    process.kill(pid, "SIGKILL");
    await waitFor("the process to die", () => !pidAlive(pid));
    expect(closeRunOwner({ state, owner, runId: "cli-order" }).closed).toBe(true);
    const before = lines(state, owner);
    const resumed = await crwFlow(["resume", "cli-order", "--state", state, "--detach", "--json"], {
      ...cliEnv,
      CRW_FLOW_FAULT: "after:started:1",
    });
    expect(resumed.code, resumed.stderr).toBe(0);
    const pid2 = Number(resumed.json().resumed_pid);
    await waitFor("the resumed process to die at its started row", () => !pidAlive(pid2));
    expect(startedRows(state, "cli-order")).toHaveLength(2);
    expect(lines(state, owner)).toEqual(before);
  });

  it("the start writes the line before any process of the run exists: while its bind waits, it has launched nothing (S000-259)", async () => {
    const state = join(root, "cli-state-259");
    const owner = fake.createOwnerThread({ cwd: root });
    const paths = runPaths(state, "cli-259");
    // this test holds the flow-bound lock: the start's bind waits for it
    const boundLock = join(ensureBoundDir(state), ".lock");
    writeFileSync(boundLock, JSON.stringify({ pid: process.pid, nonce: "test-holder" }));
    const child = spawn(
      process.execPath,
      [crwBin, "flow", "start", wfPath(), "--run", "cli-259", "--owner", owner, "--state", state, "--json"],
      { env: cliEnv, cwd: root, stdio: ["ignore", "pipe", "pipe"] },
    );
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
    });
    const exited = new Promise<number>((res) => child.on("exit", (code) => res(code ?? -1)));
    await waitFor(
      "the start's spec under its start lock",
      () => lockHolder(paths.startLock)?.pid === child.pid && existsSync(paths.spec),
    );
    // the bind comes right after the spec; give a launch made before it the time to show
    await new Promise((res) => setTimeout(res, 300));
    const launched = readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, "utf8").trim();
    const lineWhileWaiting = lines(state, owner);
    unlinkSync(boundLock);
    expect(await exited).toBe(0);
    const pid = Number((JSON.parse(out) as { pid: number }).pid);
    try {
      expect(launched).toBe("");
      expect(lineWhileWaiting).toEqual([]);
      expect(lines(state, owner)[0]).toMatchObject({
        kind: "orchestrator",
        run_id: "cli-259",
        pid: child.pid,
      });
    } finally {
      if (pidAlive(pid)) process.kill(pid, "SIGKILL");
    }
  });

  it("a holder whose line is not the last one writes it again right after its started row, with that row's pinned table (S000-261)", async () => {
    const state = join(root, "cli-state-5");
    const owner = fake.createOwnerThread({ cwd: root });
    const r = await start("cli-again", owner, state);
    expect(r.code, r.stderr).toBe(0);
    const pid = Number(r.json().pid);
    await waitFor("started row", () => startedRows(state, "cli-again").length === 1);
    process.kill(pid, "SIGKILL");
    await waitFor("the process to die", () => !pidAlive(pid));
    expect(closeRunOwner({ state, owner, runId: "cli-again" }).closed).toBe(true);
    const before = lines(state, owner).length;
    const resumed = await crwFlow(["resume", "cli-again", "--state", state, "--detach", "--json"], cliEnv);
    expect(resumed.code, resumed.stderr).toBe(0);
    const pid2 = Number(resumed.json().resumed_pid);
    try {
      await waitFor("the resumed started row", () => startedRows(state, "cli-again").length === 2);
      const [, second] = startedRows(state, "cli-again");
      const again = await waitFor("the line written again", () => {
        const ls = lines(state, owner);
        return ls.length > before ? ls : undefined;
      });
      expect(again.slice(before)).toEqual([
        expect.objectContaining({
          kind: "orchestrator",
          run_id: "cli-again",
          pid: pid2,
          policyDigest: (second as { policy_digest: string }).policy_digest,
        }),
      ]);
      expect(Date.parse(String(again.at(-1)?.at))).toBeGreaterThanOrEqual(Date.parse(String(second?.at)));
    } finally {
      if (pidAlive(pid2)) process.kill(pid2, "SIGKILL");
    }
  });

  it("a second start on the thread while the first lives warns and does not bind; an unwritable binding warns and the run starts (S000-271 S000-273 S000-307)", async () => {
    const state = join(root, "cli-state-2");
    const owner = fake.createOwnerThread({ cwd: root });
    const first = await start("cli-first", owner, state);
    expect(first.code, first.stderr).toBe(0);
    const second = await start("cli-second", owner, state);
    expect(second.code, second.stderr).toBe(0);
    const pids = [Number(first.json().pid), Number(second.json().pid)];
    try {
      expect(second.json().facts).toContainEqual(
        expect.objectContaining({
          fact: "owner_bound",
          ok: false,
          detail: expect.stringContaining("cli-first"),
        }),
      );
      await waitFor("both started rows", () => startedRows(state, "cli-second").length > 0);
      expect(lines(state, owner).map((l) => `${l.kind}:${l.run_id}`)).toEqual(["orchestrator:cli-first"]);
      // a flow-bound directory others can write is untrusted: the binding cannot be written
      const state3 = join(root, "cli-state-3");
      mkdirSync(join(state3, "flow-bound"), { recursive: true });
      chmodSync(join(state3, "flow-bound"), 0o777);
      const third = await start("cli-third", owner, state3);
      expect(third.code, third.stderr).toBe(0);
      pids.push(Number(third.json().pid));
      expect(third.json().facts).toContainEqual(expect.objectContaining({ fact: "owner_bound", ok: false }));
      await waitFor("the third run's started row", () => startedRows(state3, "cli-third").length > 0);
    } finally {
      for (const pid of pids) if (pidAlive(pid)) process.kill(pid, "SIGKILL");
    }
  });

  it("a line missing while a process holds the run is reported and stays missing; the resumed process binds it after its own started row (S000-263 S000-237)", async () => {
    const state = join(root, "cli-state-4");
    const owner = fake.createOwnerThread({ cwd: root });
    const r = await start("cli-resume", owner, state);
    expect(r.code, r.stderr).toBe(0);
    const pid = Number(r.json().pid);
    await waitFor("started row", () => startedRows(state, "cli-resume").length === 1);
    expect(closeRunOwner({ state, owner, runId: "cli-resume" }).closed).toBe(true);
    // The holder binds once, right after its started row: a close that lands before that bind is undone by
    // it. Close again until the line stays closed, so the test reads a line missing after the holder's bind.
    for (let quiet = 0; quiet < 3; ) {
      await new Promise((r) => setTimeout(r, 250));
      if (readBinding(state, owner).line === null) quiet++;
      else {
        closeRunOwner({ state, owner, runId: "cli-resume" });
        quiet = 0;
      }
    }
    const n1 = await next("cli-resume", state, cliEnv);
    expect(n1.json().warnings).toContainEqual(expect.stringContaining("owner_line_missing"));
    const n2 = await next("cli-resume", state, cliEnv);
    expect(n2.json().warnings).toContainEqual(expect.stringContaining("owner_line_missing"));
    expect(readBinding(state, owner).line).toBeNull();
    process.kill(pid, "SIGKILL");
    await waitFor("the process to die", () => !pidAlive(pid));
    const resumed = await crwFlow(["resume", "cli-resume", "--state", state, "--detach", "--json"], cliEnv);
    expect(resumed.code, resumed.stderr).toBe(0);
    const pid2 = Number(resumed.json().resumed_pid);
    try {
      await waitFor("the resumed started row", () => startedRows(state, "cli-resume").length === 2);
      const [, second] = startedRows(state, "cli-resume");
      const line = await waitFor("the line bound again", () => readBinding(state, owner).line);
      expect(line).toMatchObject({ run_id: "cli-resume", kind: "orchestrator" });
      const last = lines(state, owner).at(-1);
      expect(last?.pid).toBe(pid2);
      expect(Date.parse(String(last?.at))).toBeGreaterThanOrEqual(Date.parse(String(second?.at)));
      const n3 = await next("cli-resume", state, cliEnv);
      expect(n3.json().warnings).not.toContainEqual(expect.stringContaining("owner_line"));
    } finally {
      if (pidAlive(pid2)) process.kill(pid2, "SIGKILL");
    }
  });
});

describe("only the holder writes the owner's line while it holds the run", () => {
  let fake: FakeAppServer;
  let cliEnv: NodeJS.ProcessEnv;
  beforeAll(async () => {
    fake = await FakeAppServer.start();
    cliEnv = { ...env, CRW_FLOW_HOST: fake.url };
  });
  afterAll(async () => {
    await fake?.stop();
  });

  it("next, show, dispatched, the spawn hook and a second start on the thread leave the line as it is; the holder alone closes it when the run ends (S000-260)", async () => {
    const state = join(root, "cli-state-holder");
    const wf = join(root, "holder.mjs");
    writeFileSync(
      wf,
      `export default { name: "holder", async run(ctx) { return ctx.call({ role: "explorer", task: "one" }); } };`,
    );
    const owner = fake.createOwnerThread({ cwd: root });
    fake.startOwnerTurn(owner);
    const startRun = (runId: string) =>
      crwFlow(
        ["start", wf, "--run", runId, "--owner", owner, "--state", state, "--poll-ms", "20", "--json"],
        cliEnv,
        root,
      );
    const first = await startRun("holder-1");
    expect(first.code, first.stderr).toBe(0);
    const pids = [Number(first.json().pid)];
    try {
      const paths = runPaths(state, "holder-1");
      await waitFor("the holder's started row", () =>
        existsSync(paths.journal)
          ? readJournalFile(paths.journal).rows.some((r) => r.type === "started")
          : false,
      );
      const file = bindingFile(state, owner);
      const before = readFileSync(file, "utf8");
      expect(lines(state, owner).map((l) => `${l.kind}:${l.run_id}`)).toEqual(["orchestrator:holder-1"]);
      // every other party that runs while the holder holds the run
      const second = await startRun("holder-2");
      expect(second.code, second.stderr).toBe(0);
      pids.push(Number(second.json().pid));
      const n1 = await next("holder-1", state, cliEnv);
      const step = (n1.json().steps as Array<Record<string, unknown>>)[0];
      if (!step) throw new Error(`no step: ${n1.stdout}`);
      const agent = fake.spawnSubagent({
        ownerThreadId: owner,
        message: String(step.message),
        agentRole: "explorer",
      }).threadId;
      const hook = await new Promise<number>((resolve) => {
        const child = execFile(process.execPath, [crwBin, "flow", "hook", "pre-tool-use", "--state", state], {
          env: cliEnv,
        });
        child.stdin?.end(
          JSON.stringify({
            session_id: owner,
            hook_event_name: "PreToolUse",
            tool_name: "spawn_agent",
            tool_use_id: "call-1",
            tool_input: { message: step.message, agent_type: "explorer" },
          }),
        );
        child.on("exit", (code) => resolve(code ?? 1));
      });
      expect(hook).toBe(0);
      const dispatched = await crwFlow(
        ["dispatched", "holder-1", String(step.call), "--agent", agent, "--k", "1", "--attempt", "1"].concat([
          "--state",
          state,
          "--wait",
          "10",
          "--json",
        ]),
        cliEnv,
      );
      expect(dispatched.json()).toMatchObject({ reply: "bound" });
      expect((await crwFlow(["show", "holder-1", "--state", state], cliEnv)).code).toBe(0);
      await next("holder-1", state, cliEnv);
      await waitFor("the second run's started row", () =>
        existsSync(runPaths(state, "holder-2").journal)
          ? readJournalFile(runPaths(state, "holder-2").journal).rows.some((r) => r.type === "started")
          : false,
      );
      expect(readFileSync(file, "utf8")).toBe(before);
      // the holder ends the run and closes its line: the only line written after the start's
      fake.answer(agent, '{"done":true}');
      await waitFor("the run's end", () =>
        readJournalFile(paths.journal).rows.some((r) => r.type === "run_ended"),
      );
      await waitFor("the holder's close", () => lines(state, owner).length === 2);
      expect(lines(state, owner).map((l) => `${l.kind}:${l.run_id}`)).toEqual([
        "orchestrator:holder-1",
        "closed:holder-1",
      ]);
      expect(readFileSync(file, "utf8").startsWith(before)).toBe(true);
    } finally {
      for (const pid of pids) if (pidAlive(pid)) process.kill(pid, "SIGKILL");
    }
  });
});

describe("crw flow next reads the owner's line, never writes it", () => {
  it("next warns owner_line_missing and records nothing; the line stays missing (S000-209 S000-223 S000-263)", async () => {
    const { runId, owner, state, paths } = heldRun();
    const before = readFileSync(paths.journal, "utf8");
    const r = await next(runId, state);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json().warnings).toEqual([expect.stringContaining("owner_line_missing")]);
    expect(readFileSync(paths.journal, "utf8")).toBe(before);
    expect(existsSync(bindingFile(state, owner))).toBe(false);
    const again = await next(runId, state);
    expect(again.json().warnings).toEqual([expect.stringContaining("owner_line_missing")]);
    expect(existsSync(bindingFile(state, owner))).toBe(false);
  });

  it("next warns when the owner's last line is another live run's, or another digest's; not when it is the holder's (S000-223)", async () => {
    const other = heldRun();
    const { runId, state, paths, digest } = heldRun();
    const owner = other.owner; // both runs name one owner: the other run holds the line
    writeSpec(paths.spec, { ...JSON.parse(readFileSync(paths.spec, "utf8")), owner });
    const pairs = rolePairs(readRoleTable(root));
    expect(
      bindRunOwner({ state, owner, runId: other.runId, policyDigest: digest, rolePairs: pairs }).bound,
    ).toBe(true);
    const a = (await next(runId, state)).json();
    expect(a.warnings).toEqual([expect.stringContaining("owner_line_other_run")]);
    // the other run ends: its line is closed; the holder of this run binds under another digest
    closeRunOwner({ state, owner, runId: other.runId });
    unlock(other.paths.runLock);
    expect(bindRunOwner({ state, owner, runId, policyDigest: "sha256:other", rolePairs: pairs }).bound).toBe(
      true,
    );
    const b = (await next(runId, state)).json();
    expect(b.warnings).toEqual([expect.stringContaining("owner_line_other_digest")]);
    const bytes = readFileSync(bindingFile(state, owner), "utf8");
    expect(bindRunOwner({ state, owner, runId, policyDigest: digest, rolePairs: pairs }).bound).toBe(true);
    expect(readFileSync(bindingFile(state, owner), "utf8").length).toBeGreaterThan(bytes.length);
    const c = (await next(runId, state)).json();
    expect(c.warnings).toEqual([]);
  });

  it("a holder just past taking its process lock whose line is not yet bound is read again, then its line reported as is (S000-221)", async () => {
    const slow = { ...env, CRW_FLOW_STARTING_MS: "5000" };
    const { runId, owner, state, digest } = heldRun();
    const pairs = rolePairs(readRoleTable(root));
    const pending = next(runId, state, slow);
    await new Promise((r) => setTimeout(r, 700));
    expect(bindRunOwner({ state, owner, runId, policyDigest: digest, rolePairs: pairs }).bound).toBe(true);
    const a = (await pending).json();
    expect(a.warnings).toEqual([]);
    // past the window: reported as it is, at once
    const late = heldRun();
    const t0 = Date.now();
    const b = (await next(late.runId, late.state, { ...env, CRW_FLOW_STARTING_MS: "300" })).json();
    expect(b.warnings).toEqual([expect.stringContaining("owner_line_missing")]);
    expect(Date.now() - t0).toBeLessThan(5000);
    // a holder whose process lock was taken long ago is not waited for, whatever the window
    const old = heldRun();
    const long = new Date(Date.now() - 60_000);
    for (const f of readdirSync(old.paths.dir).filter((x) => x.startsWith("process.")))
      utimesSync(join(old.paths.dir, f), long, long);
    const t1 = Date.now();
    const c = (await next(old.runId, old.state, slow)).json();
    expect(c.warnings).toEqual([expect.stringContaining("owner_line_missing")]);
    expect(Date.now() - t1).toBeLessThan(3000);
  });

  it("next never hands out a step whose marker already has a turn_started row (a process that died right after the bind)", async () => {
    const { runId, owner, state, paths, w, digest } = heldRun();
    bindRunOwner({ state, owner, runId, policyDigest: digest, rolePairs: rolePairs(readRoleTable(root)) });
    const bus = new FileStepBus(paths.steps);
    const step = (call: string) => {
      const packet = join(paths.steps, call, "packet-t1-a1.md");
      bus.writeStep(
        {
          run_id: runId,
          call,
          k: 1,
          attempt: 1,
          op: `${call}/t1`,
          marker: `${call}/t1-a1`,
          role: "explorer",
          action: "spawn",
          agent_type: "explorer",
          model: null,
          reasoning_effort: null,
          message: spawnMessage(`${call}/t1-a1`, "explorer", "/w", packet),
          packet,
          workspace: "/w",
          agent_id: null,
        },
        "# p\n",
      );
    };
    step("explorer.1");
    step("explorer.2");
    w.append([
      {
        type: "turn_started",
        call: "explorer.1",
        op: "explorer.1/t1",
        k: 1,
        turn_id: "turn-1",
        attempt: 1,
        marker: "explorer.1/t1-a1",
        conversation_turn: 1,
      },
    ]);
    const a = (await next(runId, state)).json();
    const steps = a.steps as Array<{ call: string }>;
    expect(steps.map((s) => s.call)).toEqual(["explorer.2"]);
  });
});
