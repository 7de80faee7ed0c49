import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from "node:fs";
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
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from "vitest";
import { nextCommand } from "../src/cli/next.js";
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
    /** The backend the spec records (session by default). */
    backend?: "session" | "app-server";
    /** The policy digest the holder's started row pins ("sha256:pinned" by default). */
    pinnedDigest?: string;
    ended?: boolean;
    decision?: boolean;
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
    backend: opts.backend ?? "session",
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
        policy_digest: opts.pinnedDigest ?? "sha256:pinned",
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
        // an earlier process's pins: never reported as the holder's
        role_pairs: { ...undecided, explorer: { model: "earlier-model", effort: "low" } },
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
  if (opts.decision) {
    w.append([
      { type: "decision_requested", decision: "ship", question: "Ship it?", options: ["yes", "no"] },
    ]);
    w.append([{ type: "run_paused", reason: "waiting_decision:ship" }]);
  }
  if (opts.ended) w.append([{ type: "run_ended", status: "failed", error: "boom" }]);
  w.close();
  return { runId, state, paths, w };
}

const next = (runId: string, state: string, extra: string[] = [], e = env) =>
  crwFlow(["next", runId, "--state", state, "--json", ...extra], e);

describe("crw flow next", () => {
  describe("a run its holder holds on other pins than the role store's", () => {
    let a: Record<string, unknown>;
    let same: Record<string, unknown>;
    let before: string;
    let after: string;
    beforeAll(async () => {
      const { runId, state, paths } = fixture({ started: "mine" });
      const agreeing = fixture({ started: "mine", pinnedDigest: readRoleTable(root).policy_digest });
      before = readFileSync(paths.journal, "utf8");
      const [r, s2] = await Promise.all([next(runId, state), next(agreeing.runId, agreeing.state)]);
      expect(r.code, r.stderr).toBe(0);
      a = r.json();
      same = s2.json();
      after = readFileSync(paths.journal, "utf8");
    }, 60_000);

    it("answers with --json the steps, the slots, the spawn_formats and a hint (S000-196)", () => {
      expect(a.state).toBe("running");
      expect(a.steps).toEqual([]);
      expect(a.slots).toEqual({ limit: 3, open: 0, agents: [] });
      expect((a.spawn_formats as unknown[]).length).toBe(6);
      expect(a.hint).toEqual(expect.stringContaining("flow next"));
    });

    it("the spawn formats are the pairs the holder's started row pins, its process lock held (S000-212)", () => {
      const formats = a.spawn_formats as Array<{ role: string; arguments: Record<string, unknown> }>;
      expect(formats.find((f) => f.role === "explorer")?.arguments).toMatchObject({
        model: "pinned-model",
        reasoning_effort: "high",
        fork_context: false,
        agent_type: "explorer",
      });
      // the store decides no pair: the other roles are the host's
      expect(formats.find((f) => f.role === "critic")?.arguments).toMatchObject({ model: "<host default>" });
    });

    it("warns when the role store reads other pairs than the holder pinned, recording nothing and handing out the pins; not when they agree (S000-224)", () => {
      // the fixture binds no owner line: next also reports it missing (the binding tests cover that warning)
      expect(a.warnings).toEqual([
        expect.stringContaining("owner_line_missing"),
        "the role store reads other pairs than the run's process pinned; it runs on its pins until a resume takes the new ones",
      ]);
      expect(same.warnings).toEqual([expect.stringContaining("owner_line_missing")]);
      // recording nothing, and the holder's pins stay the formats it hands out
      expect(after).toBe(before);
      const formats = a.spawn_formats as Array<{ role: string; arguments: Record<string, unknown> }>;
      expect(formats.find((f) => f.role === "explorer")?.arguments).toMatchObject({ model: "pinned-model" });
    });

    it("writes no row of the run (S000-208)", () => {
      expect(after).toBe(before);
    });
  });

  it("the spawn formats are the newest started row's pairs while its process lock is held, and no started row's once none is (S000-212)", async () => {
    const held = fixture({ started: "mine" });
    const w = JournalWriter.open(held.paths.journal).writer;
    w.append([
      {
        type: "started",
        backend: "session",
        role_pairs: { ...undecided, explorer: { model: "newest-model", effort: "low" } },
        policy_digest: "sha256:pinned",
        process: "aaaaaaaaaaaa",
        pid: process.pid,
        process_n: 2,
      },
    ]);
    w.close();
    // a process pinned earlier-model, then paused the run and let its locks go
    const paused = fixture({ started: "none" });
    const pw = JournalWriter.open(paused.paths.journal).writer;
    pw.append([
      {
        type: "started",
        backend: "session",
        role_pairs: { ...undecided, explorer: { model: "earlier-model", effort: "low" } },
        policy_digest: "sha256:pinned",
        process: "aaaaaaaaaaaa",
        pid: 999_999,
        process_n: 1,
      },
    ]);
    pw.append([{ type: "run_paused", reason: "usage_limit" }]);
    pw.close();
    const [h, p] = (await Promise.all([next(held.runId, held.state), next(paused.runId, paused.state)])).map(
      (r) => r.json(),
    );
    const explorerOf = (a: Record<string, unknown> | undefined) =>
      (a?.spawn_formats as Array<{ role: string; arguments: Record<string, unknown> }> | undefined)?.find(
        (f) => f.role === "explorer",
      )?.arguments;
    expect(explorerOf(h)).toMatchObject({ model: "newest-model", reasoning_effort: "low" });
    expect(p?.state).toBe("paused");
    expect(explorerOf(p)).toMatchObject({ model: "<host default>" });
  });

  it("answers each state: running, waiting_session, waiting_decision, paused, ended with its status, starting (S000-195)", async () => {
    const runs = {
      running: fixture({ started: "mine" }),
      waiting_session: fixture({ started: "mine" }),
      waiting_decision: fixture({ started: "none", decision: true }),
      paused: fixture({ started: "none", paused: true }),
      ended: fixture({ started: "none", ended: true }),
      starting: fixture({ started: "dead-lock" }),
    };
    const w = runs.waiting_session;
    const packet = join(w.paths.steps, "explorer.1", "packet-t1-a1.md");
    new FileStepBus(w.paths.steps).writeStep(
      {
        run_id: w.runId,
        call: "explorer.1",
        k: 1,
        attempt: 1,
        op: "explorer.1/t1",
        marker: "explorer.1/t1-a1",
        role: "explorer",
        action: "spawn",
        agent_type: "explorer",
        model: null,
        reasoning_effort: null,
        message: spawnMessage("explorer.1/t1-a1", "explorer", "/w", packet),
        packet,
        workspace: "/w",
        agent_id: null,
      },
      "# p\n",
    );
    const answers = Object.fromEntries(
      await Promise.all(
        Object.entries(runs).map(async ([kind, f]) => [kind, (await next(f.runId, f.state)).json()] as const),
      ),
    );
    for (const kind of Object.keys(runs)) expect(answers[kind]?.state, kind).toBe(kind);
    expect(answers.ended).toMatchObject({ ended: { status: "failed" } });
    expect(answers.paused).toMatchObject({ paused: { reason: "usage_limit" } });
    expect(answers.waiting_decision).toMatchObject({
      decision: expect.objectContaining({ question: "Ship it?" }),
    });
    for (const kind of ["waiting_decision", "paused", "ended"])
      expect(answers[kind]).not.toHaveProperty("resumed_pid");
  });

  describe("a holder whose started row names a process lock that was let go", () => {
    let a: Record<string, unknown>;
    let raw: string;
    let took: number;
    let waited: Record<string, unknown>;
    let tookWaited: number;
    beforeAll(async () => {
      const f = fixture({ started: "dead-lock" });
      const g = fixture({ started: "dead-lock" });
      const t0 = Date.now();
      const [r, rw] = await Promise.all([
        next(f.runId, f.state).then((x) => {
          took = Date.now() - t0;
          return x;
        }),
        next(g.runId, g.state, ["--wait", "1"]).then((x) => {
          tookWaited = Date.now() - t0;
          return x;
        }),
      ]);
      raw = r.stdout;
      a = r.json();
      waited = rw.json();
    }, 60_000);

    it("is starting (S000-214)", () => {
      expect(a.state).toBe("starting");
      expect(waited.state).toBe("starting");
    });

    it("is read again for the starting window although no --wait was given (S000-218)", () => {
      expect(took).toBeGreaterThanOrEqual(300);
      expect(tookWaited).toBeGreaterThanOrEqual(1000);
    });

    it("names no pins of the earlier process and resumes nothing (S000-219)", () => {
      expect(raw).not.toContain("earlier-model");
      expect(a).not.toHaveProperty("resumed_pid");
      expect(waited).not.toHaveProperty("resumed_pid");
    });

    it("still starting, answers no spawn formats and a hint to ask again: now without --wait, on a change with it (S000-220)", () => {
      expect(a.spawn_formats).toEqual([]);
      expect(String(a.hint)).toContain("The run is starting; ask again now");
      expect(waited.spawn_formats).toEqual([]);
      expect(String(waited.hint)).toContain("The run is starting; ask again when its state changes");
    });
  });

  it("a starting run is read again for 15 seconds when no --wait is given, then answered starting (S000-218)", async () => {
    const f = fixture({ started: "dead-lock" });
    const out: string[] = [];
    const write = vi.spyOn(process.stdout, "write").mockImplementation((chunk) => {
      out.push(String(chunk));
      return true;
    });
    vi.useFakeTimers({ toFake: ["Date", "setTimeout", "clearTimeout"] });
    onTestFinished(() => {
      vi.useRealTimers();
      write.mockRestore();
    });
    let code: number | null = null;
    const done = nextCommand([f.runId, "--state", f.state, "--json"]).then((c) => {
      code = c;
    });
    await vi.advanceTimersByTimeAsync(14_800);
    expect(code).toBeNull();
    await vi.advanceTimersByTimeAsync(400);
    await done;
    expect(code).toBe(0);
    expect(JSON.parse(out.join(""))).toMatchObject({ state: "starting", spawn_formats: [] });
  });

  it("a starting run that becomes held within the window is read again and answered running with its holder's pins (S000-218)", async () => {
    const f = fixture({ started: "dead-lock" });
    const lock = join(f.paths.dir, "process.aaaaaaaaaaaa.lock");
    const { CRW_FLOW_STARTING_MS: _short, ...defaultWindow } = env;
    const asked = next(f.runId, f.state, [], defaultWindow);
    await new Promise((res) => setTimeout(res, 1_000));
    rmSync(lock);
    expect(tryLock(lock, { pid: process.pid, token: "aaaaaaaaaaaa" })).toBeTruthy();
    // taken long ago: next does not wait on for the holder's owner line
    const long = new Date(Date.now() - 60_000);
    utimesSync(lock, long, long);
    // the started row names this process's pid now, as its holder's would
    const w = JournalWriter.open(f.paths.journal).writer;
    w.append([
      {
        type: "started",
        backend: "session",
        role_pairs: { ...undecided, explorer: { model: "holder-model", effort: "high" } },
        policy_digest: "sha256:pinned",
        process: "aaaaaaaaaaaa",
        pid: process.pid,
        process_n: 2,
      },
    ]);
    w.close();
    const a = (await asked).json();
    expect(a.state).toBe("running");
    const explorer = (a.spawn_formats as Array<{ role: string; arguments: Record<string, unknown> }>).find(
      (x) => x.role === "explorer",
    );
    expect(explorer?.arguments).toMatchObject({ model: "holder-model" });
  });

  it("with no process lock of the run held, a newest started row that names no process is the holder's (S000-213)", async () => {
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

  it("a started row that names no process while a process lock is held is starting (S000-215)", async () => {
    const { runId, state } = fixture({ started: "no-process" });
    expect((await next(runId, state)).json().state).toBe("starting");
  });

  it("a start that holds its start lock is starting (S000-216)", async () => {
    const { runId, state, paths } = fixture({ started: "none" });
    tryLock(paths.startLock, { pid: process.pid });
    expect((await next(runId, state)).json().state).toBe("starting");
  });

  /** A repository whose role store decides the critic's model only. */
  function storeRepo(): string {
    const repo = mkdtempSync(join(root, "repo-"));
    mkdirSync(join(repo, ".crw"));
    writeFileSync(
      join(repo, ".crw", "flow-roles.json"),
      JSON.stringify({ roles: { critic: { model: "store-model" } } }),
    );
    return repo;
  }
  const criticOf = (a: Record<string, unknown>) =>
    (a.spawn_formats as Array<{ role: string; arguments: Record<string, unknown> }>).find(
      (f) => f.role === "critic",
    )?.arguments;

  it("a paused run no process holds answers the role store's formats, not the pins its earlier process recorded, and resumes nothing (S000-222)", async () => {
    const { runId, state, paths } = fixture({ started: "none", repo: storeRepo() });
    const w = JournalWriter.open(paths.journal).writer;
    w.append([
      {
        type: "started",
        backend: "session",
        role_pairs: { ...undecided, critic: { model: "earlier-model", effort: "low" } },
        policy_digest: "sha256:pinned",
        process: "aaaaaaaaaaaa",
        pid: 999_999,
        process_n: 1,
      },
      { type: "run_paused", reason: "usage_limit" },
    ]);
    w.close();
    const a = (await next(runId, state)).json();
    expect(a.state).toBe("paused");
    expect(a).not.toHaveProperty("resumed_pid");
    expect(criticOf(a)).toMatchObject({ model: "store-model", agent_type: "reviewer" });
  });

  it("a held run whose started row recorded no pairs answers the role store's pairs (S000-227)", async () => {
    const { runId, state, paths } = fixture({ started: "mine", repo: storeRepo() });
    // the holder's own started row (newest, its process lock held) pins nothing
    const w = JournalWriter.open(paths.journal).writer;
    w.append([
      {
        type: "started",
        backend: "session",
        role_pairs: {},
        policy_digest: "sha256:pinned",
        process: "aaaaaaaaaaaa",
        pid: process.pid,
        process_n: 2,
      },
    ]);
    w.close();
    const a = (await next(runId, state)).json();
    expect(a.state).toBe("running");
    expect(criticOf(a)).toMatchObject({ model: "store-model" });
  });

  describe("a run with two open subagents, one ended, a close step and a spawn step on three agent threads", () => {
    let a: Record<string, unknown>;
    let again: Record<string, unknown>;
    let closeFile: string;
    let stepFile: string;
    let closeBefore: boolean;
    let closeAfterFirst: boolean;
    let before: string;
    let after: string;
    const next2 = { stepStays: false };
    beforeAll(async () => {
      const f = fixture({ started: "mine" });
      const { runId, state, paths } = f;
      closeFile = join(paths.steps, "explorer.9", "close-a1-agent-old.json");
      stepFile = join(paths.steps, "reviewer.1", "t1-a1.json");
      const w = JournalWriter.open(paths.journal).writer;
      for (const [i, agent] of ["agent-a", "agent-b", "agent-done"].entries()) {
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
      // explorer.3 has ended: its subagent holds no slot
      w.append([
        {
          type: "completed",
          call: "explorer.3",
          op: "explorer.3/t1",
          k: 1,
          attempt: 1,
          result: {},
          result_digest: digestOf({}),
          raw_text: "{}",
          extracted: false,
          tokens: {},
        },
      ]);
      w.close();
      const bus = new FileStepBus(paths.steps);
      bus.writeClose({
        run_id: runId,
        call: "explorer.9",
        attempt: 1,
        action: "close",
        agent_id: "agent-old",
      });
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
      closeBefore = existsSync(closeFile);
      before = readFileSync(paths.journal, "utf8");
      a = (await next(runId, state)).json();
      closeAfterFirst = existsSync(closeFile);
      again = (await next(runId, state)).json();
      next2.stepStays = existsSync(stepFile);
      after = readFileSync(paths.journal, "utf8");
    }, 60_000);

    it("slots: limit is agents.max_threads; open counts the subagents of calls not ended and the close steps not taken (S000-197)", () => {
      expect(a.state).toBe("waiting_session");
      expect(a.slots).toEqual({
        limit: 3,
        open: 3,
        agents: expect.arrayContaining(["agent-old", "agent-a", "agent-b"]),
      });
      expect((a.slots as { agents: string[] }).agents).not.toContain("agent-done");
      // the close step handed out is no longer counted
      expect(again.slots).toEqual({
        limit: 3,
        open: 2,
        agents: expect.arrayContaining(["agent-a", "agent-b"]),
      });
    });

    it("a close step's host call is close_agent(target) (S000-202)", () => {
      expect((a.steps as Array<Record<string, unknown>>)[0]).toMatchObject({
        action: "close",
        agent_id: "agent-old",
        host_call: { tool: "close_agent", arguments: { target: "agent-old" } },
      });
    });

    it("the hint says to alternate wait_agent on the open subagents' ids with next --wait (S000-203)", () => {
      const open = (a.slots as { agents: string[] }).agents;
      expect(String(a.hint)).toContain(
        `Alternate wait_agent(targets=${JSON.stringify(open)}, timeout_ms=30000) with `,
      );
      expect(String(a.hint)).toMatch(/with \S+ \S+ flow next \S+ --state \S+ --wait 10 --json\./);
    });

    it("the hint says which subagents to close first (S000-204)", () => {
      expect(String(a.hint)).toContain("Close first: close_agent(agent-old).");
      expect(String(again.hint)).not.toContain("Close first");
    });

    it("with the slots full the hint says the agent thread limit is reached, and the spawn step stays (S000-205)", () => {
      expect(String(a.hint)).toContain("Agent thread limit reached: the step stays");
      expect((a.steps as Array<{ action: string }>).map((x) => x.action)).toEqual(["close", "spawn"]);
      expect((again.steps as Array<{ action: string }>).map((x) => x.action)).toEqual(["spawn"]);
      expect(String(again.hint)).not.toContain("Agent thread limit reached");
      expect(next2.stepStays).toBe(true);
    });

    it("a close step's file is removed once next has handed it out, and is handed out once (S000-206)", () => {
      expect(closeBefore).toBe(true);
      expect(closeAfterFirst).toBe(false);
      expect((again.steps as Array<{ action: string }>).some((x) => x.action === "close")).toBe(false);
    });

    it("next writes no row while it hands steps out (S000-208)", () => {
      expect(after).toBe(before);
    });
  });

  it("for a run next resumed, next warns that the new process repinned the role store's pairs (S000-226)", async () => {
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
});

describe("a run no process holds", () => {
  let fake: FakeAppServer;
  let owner: string;
  let wf: string;
  // the resumed process may take a while to start: the default starting window
  const defaultWindow = () => {
    const { CRW_FLOW_STARTING_MS: _short, ...rest } = env;
    return rest;
  };
  const pids: number[] = [];
  beforeAll(async () => {
    fake = await FakeAppServer.start();
    owner = fake.createOwnerThread({ cwd: root });
    wf = join(root, "resumable-2.mjs");
    writeFileSync(
      wf,
      'export default { name: "r", run: (ctx) => ctx.call({ role: "explorer", task: "t" }) };',
    );
  });
  afterAll(async () => {
    for (const p of pids) if (pidAlive(p)) process.kill(p, "SIGKILL");
    await fake?.stop();
  });
  const resumable = (backend: "session" | "app-server" = "session") => {
    const f = fixture({ host: fake.url, started: "none", backend });
    const spec = JSON.parse(readFileSync(f.paths.spec, "utf8"));
    writeSpec(f.paths.spec, { ...spec, workflow: wf, owner, poll_ms: 20 });
    return f;
  };
  const startedRows = (journal: string) =>
    readFileSync(journal, "utf8")
      .split("\n")
      .filter((l) => l.includes('"type":"started"'))
      .map((l) => JSON.parse(l) as { backend: string; pid: number });

  describe("neither paused nor over, asked with --wait 20", () => {
    let a: Record<string, unknown>;
    let took: number;
    let started: Array<{ backend: string; pid: number }>;
    beforeAll(async () => {
      const f = resumable();
      const t0 = Date.now();
      const r = await next(f.runId, f.state, ["--wait", "20"], defaultWindow());
      took = Date.now() - t0;
      a = r.json();
      pids.push(Number(a.resumed_pid));
      started = await waitFor("the resumed process's started row", () => {
        const rows = startedRows(f.paths.journal);
        return rows.length > 0 ? rows : undefined;
      });
    }, 60_000);

    it("is resumed as resume --detach does it, and the hint names the resumed_pid (S000-207)", () => {
      expect(a.resumed_pid).toEqual(expect.any(Number));
      expect(String(a.hint)).toContain(
        `No process held the run: it was resumed (resumed_pid ${a.resumed_pid}).`,
      );
      expect(started.map((x) => x.pid)).toEqual([a.resumed_pid]);
    });

    it("--wait waits for the step the resumed process publishes, well within its bound (S000-198)", () => {
      expect(a.state).toBe("waiting_session");
      expect((a.steps as Array<{ call: string }>).map((x) => x.call)).toEqual(["explorer.1"]);
      expect(took).toBeLessThan(20_000);
    });

    it("a run next resumed whose process repinned nothing gets no repinned warning (S000-226)", () => {
      expect((a.warnings as string[] | undefined) ?? []).not.toContainEqual(
        expect.stringContaining("repinned"),
      );
    });

    it("a run whose first process stored no started row resumes on its spec's backend (S000-235)", () => {
      expect(started.map((x) => x.backend)).toEqual(["session"]);
    });
  });

  it("a run whose first process stored no started row and whose spec names app-server resumes on app-server (S000-235)", async () => {
    const f = resumable("app-server");
    const a = (await next(f.runId, f.state, [], defaultWindow())).json();
    pids.push(Number(a.resumed_pid));
    const started = await waitFor("the resumed process's started row", () => {
      const rows = startedRows(f.paths.journal);
      return rows.length > 0 ? rows : undefined;
    });
    expect(started.map((x) => [x.backend, x.pid])).toEqual([["app-server", a.resumed_pid]]);
  });

  it("next's resume and resume --detach go on with the backend the started row records: the same as the spec's runs, another is refused (S000-232)", async () => {
    const withStarted = (spec: "session" | "app-server", row: "session" | "app-server") => {
      const f = resumable(spec);
      const w = JournalWriter.open(f.paths.journal).writer;
      w.append([
        {
          type: "started",
          backend: row,
          role_pairs: undecided,
          policy_digest: readRoleTable(root).policy_digest,
          process: null,
          pid: 999_999,
          process_n: 1,
        },
      ]);
      w.close();
      return f;
    };
    const same = withStarted("app-server", "app-server");
    const mixedNext = withStarted("session", "app-server");
    const mixedDetach = withStarted("session", "app-server");
    const [a, b, c] = await Promise.all([
      next(same.runId, same.state).then((r) => r.json()),
      next(mixedNext.runId, mixedNext.state).then((r) => r.json()),
      crwFlow(["resume", mixedDetach.runId, "--detach", "--state", mixedDetach.state, "--json"], env).then(
        (r) => r.json(),
      ),
    ]);
    for (const x of [a, b, c]) pids.push(Number(x.resumed_pid));
    const second = await waitFor("the resumed process's started row", () => {
      const rows = startedRows(same.paths.journal);
      return rows.length > 1 ? rows : undefined;
    });
    expect(second.map((x) => x.backend)).toEqual(["app-server", "app-server"]);
    for (const [f, x] of [
      [mixedNext, b],
      [mixedDetach, c],
    ] as const) {
      await waitFor("the refused process to exit", () => !pidAlive(Number(x.resumed_pid)));
      expect(readFileSync(f.paths.log, "utf8")).toContain(
        `run ${f.runId} runs on the app-server backend (its started row); a resume on session is refused`,
      );
      expect(startedRows(f.paths.journal)).toHaveLength(1);
    }
  });

  it("a paused run and an ended run are not resumed, and next appends nothing to them (S000-207)", async () => {
    const paused = fixture({ started: "none", paused: true });
    const ended = fixture({ started: "none", ended: true });
    const before = [readFileSync(paused.paths.journal, "utf8"), readFileSync(ended.paths.journal, "utf8")];
    const [p, e] = await Promise.all([next(paused.runId, paused.state), next(ended.runId, ended.state)]);
    expect(p.json()).not.toHaveProperty("resumed_pid");
    expect(e.json()).not.toHaveProperty("resumed_pid");
    expect([readFileSync(paused.paths.journal, "utf8"), readFileSync(ended.paths.journal, "utf8")]).toEqual(
      before,
    );
  });
});

describe("next --wait on a held run with no step", () => {
  it("returns after the seconds it was given when nothing changes, and at once on a change of state (S000-198)", async () => {
    const still = fixture({ started: "mine" });
    const changing = fixture({ started: "mine" });
    const t0 = Date.now();
    const times: Record<string, number> = {};
    const asked = Promise.all([
      next(still.runId, still.state, ["--wait", "2"]).then((r) => {
        times.still = Date.now() - t0;
        return r.json();
      }),
      next(changing.runId, changing.state, ["--wait", "30"]).then((r) => {
        times.changing = Date.now() - t0;
        return r.json();
      }),
    ]);
    await new Promise((res) => setTimeout(res, 1_000));
    const w = JournalWriter.open(changing.paths.journal).writer;
    w.append([{ type: "run_ended", status: "completed", result: null }]);
    w.close();
    const [a, b] = await asked;
    expect(a.state).toBe("running");
    expect(times.still).toBeGreaterThanOrEqual(2_000);
    expect(times.still).toBeLessThan(10_000);
    expect(b).toMatchObject({ state: "ended", ended: { status: "completed" } });
    expect(times.changing).toBeGreaterThanOrEqual(1_000);
    expect(times.changing).toBeLessThan(15_000);
  });
});
