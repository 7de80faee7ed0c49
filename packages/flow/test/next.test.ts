import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  digestOf,
  FileStepBus,
  JournalWriter,
  pidAlive,
  readRoleTable,
  runPaths,
  SPEC_FORMAT,
  spawnMessage,
  tryLock,
  writeSpec,
} from "@crw/flow";
import { FakeAppServer } from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { cliRoot, crwFlow, waitFor } from "./helpers/cli.js";
import { nullRolePairs as undecided } from "./helpers/harness.js";

let root: string;
let env: NodeJS.ProcessEnv;
let n = 0;

beforeAll(() => {
  ({ root, env } = cliRoot("crw-flow-next-", { CRW_FLOW_STARTING_MS: "300" }));
}, 120_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A run directory as a run process leaves it; `holder` says who holds the locks. */
function fixture(
  opts: {
    host?: string;
    started?: "mine" | "dead-lock" | "no-process" | "none";
    paused?: boolean;
    repo?: string;
  } = {},
) {
  const runId = `next-${n++}`;
  const state = join(root, "state");
  const repo = opts.repo ?? root;
  const paths = runPaths(state, runId);
  mkdirSync(paths.dir, { recursive: true });
  writeSpec(paths.spec, {
    format: SPEC_FORMAT,
    run_id: runId,
    workflow: join(root, "w.mjs"),
    workflow_name: "w",
    input: null,
    backend: "session",
    owner: "owner-1",
    pool: 2,
    repo,
    host: opts.host ?? "ws://127.0.0.1:9",
    created_at: new Date().toISOString(),
  });
  const w = JournalWriter.create(paths.journal, runId);
  const token = "aaaaaaaaaaaa";
  const digest = readRoleTable(repo).policy_digest;
  if (opts.started === "mine") {
    tryLock(join(paths.dir, `process.${token}.lock`), { pid: process.pid, token });
    tryLock(paths.runLock, { pid: process.pid, token });
    w.append([
      {
        type: "started",
        backend: "session",
        role_pairs: { ...undecided, explorer: { model: "pinned-model", effort: "high" } },
        policy_digest: "sha256:pinned",
        process: token,
        pid: process.pid,
        process_n: 1,
      },
    ]);
  } else if (opts.started === "dead-lock") {
    writeFileSync(join(paths.dir, `process.${token}.lock`), JSON.stringify({ pid: 999_999, token }));
    tryLock(paths.runLock, { pid: process.pid });
    w.append([
      {
        type: "started",
        backend: "session",
        role_pairs: undecided,
        policy_digest: digest,
        process: token,
        pid: 999_999,
        process_n: 1,
      },
    ]);
  } else if (opts.started === "no-process") {
    tryLock(join(paths.dir, "process.bbbbbbbbbbbb.lock"), { pid: process.pid, token: "bbbbbbbbbbbb" });
    tryLock(paths.runLock, { pid: process.pid });
    w.append([
      {
        type: "started",
        backend: "session",
        role_pairs: undecided,
        policy_digest: digest,
        process: null,
        pid: 1,
        process_n: 1,
      },
    ]);
  }
  if (opts.paused) w.append([{ type: "run_paused", reason: "usage_limit" }]);
  w.close();
  return { runId, state, paths, w };
}

const next = (runId: string, state: string, extra: string[] = [], e = env) =>
  crwFlow(["next", runId, "--state", state, "--json", ...extra], e);

describe("crw flow next", () => {
  it("S000-195 S000-196 S000-212 S000-224 S000-208: a held run answers its holder's pins, warns when the store differs, writes no row", async () => {
    const { runId, state, paths } = fixture({ started: "mine" });
    const before = readFileSync(paths.journal, "utf8");
    const r = await next(runId, state);
    expect(r.code, r.stderr).toBe(0);
    const a = r.json();
    expect(a.state).toBe("running");
    const explorer = (a.spawn_formats as Array<{ role: string; arguments: Record<string, unknown> }>).find(
      (f) => f.role === "explorer",
    );
    expect(explorer?.arguments).toMatchObject({
      model: "pinned-model",
      reasoning_effort: "high",
      fork_context: false,
      agent_type: "explorer",
    });
    // the fixture binds no owner line: next also reports it missing (the binding tests cover that warning)
    expect(a.warnings).toEqual([
      expect.stringContaining("owner_line_missing"),
      expect.stringContaining("the role store reads other pairs"),
    ]);
    expect(readFileSync(paths.journal, "utf8")).toBe(before);
  });

  it("S000-214 S000-218 S000-220 S000-219: a holder whose started row names a let-go process lock is starting: no formats, ask again", async () => {
    const { runId, state } = fixture({ started: "dead-lock" });
    const t0 = Date.now();
    const a = (await next(runId, state)).json();
    expect(a.state).toBe("starting");
    expect(a.spawn_formats).toEqual([]);
    expect(String(a.hint)).toContain("ask again now");
    expect(Date.now() - t0).toBeGreaterThanOrEqual(300); // it read the run again for the starting window
    expect(a).not.toHaveProperty("resumed_pid");
  });

  it("S000-213: with no process lock of the run held, a newest started row that names no process is the holder's", async () => {
    const { runId, state, paths } = fixture({ started: "none" });
    tryLock(paths.runLock, { pid: process.pid });
    const w = JournalWriter.open(paths.journal).writer;
    w.append([
      {
        type: "started",
        backend: "session",
        role_pairs: { ...undecided, architect: { model: "old-crw", effort: null } },
        policy_digest: "sha256:old",
        process: null,
        pid: process.pid,
        process_n: 1,
      },
    ]);
    w.close();
    const a = (await next(runId, state)).json();
    expect(a.state).toBe("running");
    const architect = (a.spawn_formats as Array<{ role: string; arguments: Record<string, unknown> }>).find(
      (f) => f.role === "architect",
    );
    expect(architect?.arguments).toMatchObject({ model: "old-crw" });
  });

  it("S000-215: a started row that names no process while a process lock is held is starting", async () => {
    const { runId, state } = fixture({ started: "no-process" });
    expect((await next(runId, state)).json().state).toBe("starting");
  });

  it("S000-216: a start that holds its start lock is starting", async () => {
    const { runId, state, paths } = fixture({ started: "none" });
    tryLock(paths.startLock, { pid: process.pid });
    expect((await next(runId, state)).json().state).toBe("starting");
  });

  it("S000-222 S000-227 S000-195: a paused run no process holds answers paused with the role store's formats and resumes nothing", async () => {
    const repo = mkdtempSync(join(root, "repo-"));
    mkdirSync(join(repo, ".crw"));
    writeFileSync(
      join(repo, ".crw", "flow-roles.json"),
      JSON.stringify({ roles: { critic: { model: "store-model" } } }),
    );
    const { runId, state } = fixture({ started: "none", paused: true, repo });
    const a = (await next(runId, state)).json();
    expect(a.state).toBe("paused");
    expect(a).not.toHaveProperty("resumed_pid");
    const critic = (a.spawn_formats as Array<{ role: string; arguments: Record<string, unknown> }>).find(
      (f) => f.role === "critic",
    );
    expect(critic?.arguments).toMatchObject({ model: "store-model", agent_type: "reviewer" });
  });

  it("S000-197 S000-205 S000-206 S000-202 S000-203 S000-204: slots count open subagents and close steps; a full table says so; a close step is handed out once", async () => {
    const { runId, state, paths } = fixture({ started: "mine" });
    const w = JournalWriter.open(paths.journal).writer;
    for (const [i, agent] of ["agent-a", "agent-b"].entries()) {
      const call = `explorer.${i + 1}`;
      const input = { role: "explorer" as const, task: "t", schema: null, workspace: null };
      w.append([
        {
          type: "prepared",
          call,
          op: call,
          role: "explorer",
          input,
          input_digest: digestOf(input),
          backend: "session",
          allocation: { workspace: "/w", kind: "scratch" },
        },
      ]);
      w.append([
        {
          type: "thread_started",
          call,
          thread_id: agent,
          model: null,
          effort: null,
          cwd: "/w",
          host_cwd: "/h",
          parent_thread_id: "owner-1",
          agent_role: "explorer",
          attempt: 1,
          via: "session",
          rollout_path: null,
          marker: `${call}/t1-a1`,
        },
      ]);
    }
    w.close();
    const bus = new FileStepBus(paths.steps);
    bus.writeClose({ run_id: runId, call: "explorer.9", attempt: 1, action: "close", agent_id: "agent-old" });
    const packet = join(paths.steps, "reviewer.1", "packet-t1-a1.md");
    bus.writeStep(
      {
        run_id: runId,
        call: "reviewer.1",
        k: 1,
        attempt: 1,
        op: "reviewer.1/t1",
        marker: "reviewer.1/t1-a1",
        role: "reviewer",
        action: "spawn",
        agent_type: "reviewer",
        model: null,
        reasoning_effort: null,
        message: spawnMessage("reviewer.1/t1-a1", "reviewer", "/w", packet),
        packet,
        workspace: "/w",
        agent_id: null,
      },
      "# p\n",
    );
    const a = (await next(runId, state)).json();
    expect(a.state).toBe("waiting_session");
    expect(a.slots).toEqual({
      limit: 3,
      open: 3,
      agents: expect.arrayContaining(["agent-old", "agent-a", "agent-b"]),
    });
    const steps = a.steps as Array<Record<string, unknown>>;
    expect(steps[0]).toMatchObject({
      action: "close",
      agent_id: "agent-old",
      host_call: { tool: "close_agent", arguments: { target: "agent-old" } },
    });
    expect(String(a.hint)).toContain("Agent thread limit reached");
    expect(String(a.hint)).toContain("close_agent(agent-old)");
    expect(String(a.hint)).toContain("wait_agent(targets=");
    expect(existsSync(join(paths.steps, "explorer.9", "close-a1-agent-old.json"))).toBe(false);
    const again = (await next(runId, state)).json();
    expect((again.steps as Array<{ action: string }>).map((s) => s.action)).toEqual(["spawn"]);
    expect(again.slots).toMatchObject({ open: 2 });
  });

  it("S000-226: for a run next resumed, next warns that the new process repinned the role store's pairs", async () => {
    const fake = await FakeAppServer.start();
    try {
      const owner = fake.createOwnerThread({ cwd: root });
      const repo = mkdtempSync(join(root, "repo-"));
      const wf = join(root, "repin.mjs");
      writeFileSync(
        wf,
        'export default { name: "r", run: (ctx) => ctx.call({ role: "explorer", task: "t" }) };',
      );
      const { runId, state, paths } = fixture({ host: fake.url, started: "none", repo });
      const w = JournalWriter.open(paths.journal).writer;
      w.append([
        {
          type: "started",
          backend: "session",
          role_pairs: undecided,
          policy_digest: readRoleTable(repo).policy_digest,
          process: null,
          pid: 999_999,
          process_n: 1,
        },
      ]);
      w.close();
      mkdirSync(join(repo, ".crw"));
      writeFileSync(
        join(repo, ".crw", "flow-roles.json"),
        JSON.stringify({ roles: { explorer: { model: "m-new" } } }),
      );
      const spec = JSON.parse(readFileSync(paths.spec, "utf8"));
      writeSpec(paths.spec, { ...spec, workflow: wf, owner, poll_ms: 20 });
      const { CRW_FLOW_STARTING_MS: _short, ...defaultWindow } = env;
      const a = (await next(runId, state, [], defaultWindow)).json();
      expect(a.resumed_pid).toEqual(expect.any(Number));
      expect(a.warnings).toEqual(expect.arrayContaining([expect.stringContaining("repinned")]));
      process.kill(Number(a.resumed_pid), "SIGKILL");
      await waitFor("the resumed process to die", () => !pidAlive(Number(a.resumed_pid)));
    } finally {
      await fake.stop();
    }
  });

  it("S000-207 S000-198 S000-235 S000-232: a run no process holds that is neither paused nor over is resumed (resumed_pid)", async () => {
    const fake = await FakeAppServer.start();
    try {
      const owner = fake.createOwnerThread({ cwd: root });
      const wf = join(root, "resumable.mjs");
      writeFileSync(
        wf,
        'export default { name: "r", run: (ctx) => ctx.call({ role: "explorer", task: "t" }) };',
      );
      const { runId, state, paths } = fixture({ host: fake.url, started: "none" });
      const spec = JSON.parse(readFileSync(paths.spec, "utf8"));
      writeSpec(paths.spec, { ...spec, workflow: wf, owner, poll_ms: 20 });
      const { CRW_FLOW_STARTING_MS: _short, ...defaultWindow } = env; // the resumed process may take a while to start
      const r = await next(runId, state, ["--wait", "20"], defaultWindow);
      const a = r.json();
      expect(a.resumed_pid, r.stderr).toEqual(expect.any(Number));
      expect(String(a.hint)).toContain(`resumed_pid ${a.resumed_pid}`);
      expect(a.state).toBe("waiting_session"); // --wait waited for the step
      process.kill(Number(a.resumed_pid), "SIGKILL");
      await waitFor("the resumed process to die", () => !pidAlive(Number(a.resumed_pid)));
    } finally {
      await fake.stop();
    }
  });
});
