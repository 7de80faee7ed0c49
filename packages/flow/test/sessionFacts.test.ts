import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  bindRunOwner,
  executeRun,
  listStepFiles,
  pidAlive,
  readCodexSettings,
  readSpec,
  resolveTable,
  runPaths,
  sessionFacts,
  tryLock,
} from "@crw/flow";
import { FakeAppServer } from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { crwFlow, ensureBuilt } from "./helpers/cli.js";
import { answerSchema, defineWorkflow, inProcessRun } from "./helpers/harness.js";

let root: string;
beforeAll(() => {
  ensureBuilt();
  root = mkdtempSync(join(tmpdir(), "crw-flow-facts-"));
}, 120_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

function codexHome(toml: string): NodeJS.ProcessEnv {
  const home = mkdtempSync(join(root, "codex-home-"));
  writeFileSync(join(home, "config.toml"), toml);
  return { ...process.env, CODEX_HOME: home };
}

const factsFor = (toml: string, roles: unknown = {}, extra: { verifier?: unknown } = {}) => {
  const env = codexHome(toml);
  const codex = readCodexSettings(env);
  const state = mkdtempSync(join(root, "state-"));
  const paths = runPaths(state, "r1");
  mkdirSync(paths.dir, { recursive: true });
  const table = resolveTable({ roles, ...extra }, null);
  const bind = bindRunOwner({
    state,
    owner: "owner-a",
    runId: "r1",
    policyDigest: table.policy_digest,
    rolePairs: Object.fromEntries(Object.entries(table.roles).map(([k, v]) => [k, v])),
  });
  return { facts: sessionFacts({ owner: "owner-a", codex, paths, repo: root, table, bind, pool: 4 }), codex };
};

describe("the start preview's session facts", () => {
  it("agents.max_threads is read from <CODEX_HOME>/config.toml, default 6; [agents.<type>] tables are the configured agent types (S000-190)", () => {
    expect(readCodexSettings(codexHome("")).maxThreads).toBe(6);
    const s = readCodexSettings(
      codexHome(
        '[agents]\nmax_threads = 4 # four\n\n[agents.architect]\ndescription = "a"\n[agents."reviewer"]\n[features]\nmulti_agent_v2 = true\n',
      ),
    );
    expect(s).toMatchObject({ maxThreads: 4, multiAgentV2: true, agentTypes: ["architect", "reviewer"] });
  });

  describe("the six facts of a run on a store with undecided pairs, and of one with every pair", () => {
    const byFact = (facts: Array<{ fact: string; ok: boolean; detail: string }>) =>
      Object.fromEntries(facts.map((f) => [f.fact, f]));
    const all = Object.fromEntries(
      ["architect", "executor", "executor-t1", "reviewer", "explorer", "critic"].map((r) => [
        r,
        { model: "m", effort: "high" },
      ]),
    );
    const configured = "[agents.architect]\n[agents.executor]\n[agents.reviewer]\n[agents.critic]\n";

    it("names the six facts in order, verifier_prerequisites the sixth", () => {
      const { facts } = factsFor("[agents]\nmax_threads = 6\n");
      expect(facts.map((f) => f.fact)).toEqual([
        "owner_bound",
        "role_models",
        "owner_state_writable",
        "subagent_slots",
        "multi_agent_v1",
        "verifier_prerequisites",
      ]);
      expect(byFact(facts).owner_bound?.ok).toBe(true);
    });

    it("owner_bound holds for a thread id with a binding that reads back and no other live run, and fails otherwise (S000-307)", () => {
      const ok = byFact(factsFor("").facts).owner_bound;
      expect(ok).toEqual({
        fact: "owner_bound",
        ok: true,
        detail: "owner thread owner-a is bound to the run",
      });
      const env = codexHome("");
      const state = mkdtempSync(join(root, "state-"));
      const table = resolveTable({ roles: {} }, null);
      const of = (runId: string, owner: string, bind: ReturnType<typeof bindRunOwner> | null) => {
        const paths = runPaths(state, runId);
        mkdirSync(paths.dir, { recursive: true });
        const codex = readCodexSettings(env);
        return byFact(sessionFacts({ owner, codex, paths, repo: root, table, bind, pool: 4 })).owner_bound;
      };
      expect(of("r0", "", null)).toMatchObject({ ok: false, detail: "no owner thread id" });
      expect(of("r0", "owner-b", null)).toMatchObject({
        ok: false,
        detail: expect.stringContaining("no binding"),
      });
      // another run of the thread lives: its process holds its run lock
      const first = runPaths(state, "r1");
      mkdirSync(first.dir, { recursive: true });
      const pairs = Object.fromEntries(Object.entries(table.roles));
      bindRunOwner({
        state,
        owner: "owner-b",
        runId: "r1",
        policyDigest: table.policy_digest,
        rolePairs: pairs,
      });
      tryLock(first.runLock, { pid: process.pid });
      const second = bindRunOwner({
        state,
        owner: "owner-b",
        runId: "r2",
        policyDigest: table.policy_digest,
        rolePairs: pairs,
      });
      expect(of("r2", "owner-b", second)).toMatchObject({ ok: false, detail: expect.stringContaining("r1") });
      // another run of the thread is still starting: no process yet, its start holds the start lock
      const starting = runPaths(state, "r3");
      mkdirSync(starting.dir, { recursive: true });
      const bindOf = (owner: string, runId: string, at = state) =>
        bindRunOwner({ state: at, owner, runId, policyDigest: table.policy_digest, rolePairs: pairs });
      bindOf("owner-c", "r3");
      tryLock(starting.startLock, { pid: process.pid });
      expect(of("r4", "owner-c", bindOf("owner-c", "r4"))).toMatchObject({
        ok: false,
        detail: expect.stringContaining("live run r3"),
      });
      // a binding that cannot be read back: a flow-bound directory others may write is not trusted
      const open = mkdtempSync(join(root, "state-"));
      mkdirSync(join(open, "flow-bound"), { recursive: true });
      chmodSync(join(open, "flow-bound"), 0o777);
      expect(of("r5", "owner-d", bindOf("owner-d", "r5", open))).toMatchObject({
        ok: false,
        detail: expect.stringContaining("cannot be written"),
      });
    });

    it("role_models lists the six pairs and flags a role without a model, and a role with a model but no effort (S000-308)", () => {
      const undecided = byFact(factsFor(`[agents]\nmax_threads = 6\n${configured}`).facts).role_models;
      expect(undecided?.ok).toBe(false);
      expect(undecided?.detail).toContain("architect has no model");
      const noEffort = byFact(
        factsFor(`[agents]\nmax_threads = 6\n${configured}`, { ...all, reviewer: { model: "m" } }).facts,
      ).role_models;
      expect(noEffort).toMatchObject({ ok: false });
      expect(noEffort?.detail).toContain("reviewer has no effort");
      expect(noEffort?.detail).not.toContain("has no model");
      const good = byFact(factsFor(`[agents]\nmax_threads = 6\n${configured}`, all).facts).role_models;
      expect(good).toEqual({
        fact: "role_models",
        ok: true,
        detail:
          "architect=m/high, executor=m/high, executor-t1=m/high, reviewer=m/high, explorer=m/high, critic=m/high",
      });
    });

    it("role_models flags an agent_type the host refuses unless [agents.<type>] is configured", () => {
      const { facts } = factsFor("[agents]\nmax_threads = 6\n", all);
      const f = byFact(facts).role_models;
      expect(f?.ok).toBe(false);
      expect(f?.detail).toContain("agent_type architect");
      expect(f?.detail).toContain("[agents.executor]");
    });

    it("subagent_slots holds while agents.max_threads leaves a slot for a call beside the owner, and fails at one thread (S000-311)", () => {
      expect(byFact(factsFor("[agents]\nmax_threads = 6\n").facts).subagent_slots?.ok).toBe(true);
      expect(byFact(factsFor("[agents]\nmax_threads = 2\n").facts).subagent_slots?.ok).toBe(true);
      expect(byFact(factsFor("[agents]\nmax_threads = 1\n").facts).subagent_slots).toMatchObject({
        ok: false,
        detail: expect.stringContaining("leaves no slot"),
      });
    });

    it("multi_agent_v1 holds with features.multi_agent_v2 off and fails naming it when it is on (S000-312)", () => {
      expect(byFact(factsFor("[agents]\nmax_threads = 6\n").facts).multi_agent_v1?.ok).toBe(true);
      expect(
        byFact(factsFor("[agents]\nmax_threads = 6\n[features]\nmulti_agent_v2 = true\n").facts)
          .multi_agent_v1,
      ).toMatchObject({ ok: false, detail: expect.stringContaining("multi_agent_v2") });
    });

    it("verifier_prerequisites is judged for every run: without a verifier, with a go_root lacking go, with an executable go (S000-313)", () => {
      const none = byFact(factsFor("").facts).verifier_prerequisites;
      expect(none?.ok).toBe(true);
      const missing = byFact(
        factsFor("", all, { verifier: { go_root: join(root, "no-go") } }).facts,
      ).verifier_prerequisites;
      expect(missing).toMatchObject({ ok: false, detail: expect.stringContaining("no-go") });
      const goRoot = join(root, "go");
      mkdirSync(join(goRoot, "bin"), { recursive: true });
      writeFileSync(join(goRoot, "bin", "go"), "#!/bin/sh\n");
      chmodSync(join(goRoot, "bin", "go"), 0o755);
      const withGo = byFact(
        factsFor("", all, { verifier: { go_root: goRoot } }).facts,
      ).verifier_prerequisites;
      expect(withGo?.ok).toBe(true);
    });
  });

  it("owner_state_writable holds while the run directory, the flow-bound directory, the control socket's directory and the repository are writable, and names each one that is not (S000-310)", () => {
    const state = mkdtempSync(join(root, "state-"));
    const table = resolveTable({ roles: {} }, null);
    const factOf = (paths: ReturnType<typeof runPaths>, repo: string) =>
      sessionFacts({
        owner: "o",
        codex: readCodexSettings(codexHome("")),
        paths,
        repo,
        table,
        bind: null,
        pool: 4,
      }).find((f) => f.fact === "owner_state_writable");
    const paths = runPaths(state, "r1");
    mkdirSync(paths.dir, { recursive: true });
    mkdirSync(join(state, "flow-bound"));
    const host = process.env.CRW_FLOW_HOST;
    const socketDir = mkdtempSync(join(root, "socket-"));
    process.env.CRW_FLOW_HOST = `unix://${join(socketDir, "control.sock")}`;
    try {
      expect(factOf(paths, root)).toMatchObject({ ok: true, detail: expect.stringContaining("flow-bound") });
      // each directory in turn made unusable (root may write anywhere, so a path that is no directory)
      const file = join(root, "not-a-directory");
      writeFileSync(file, "");
      expect(factOf(runPaths(state, "gone"), root)?.detail).toMatch(
        /^run directory '.*gone' does not exist$/,
      );
      expect(factOf(paths, file)?.detail).toBe(`repository '${file}' is not a directory`);
      process.env.CRW_FLOW_HOST = `unix://${join(file, "control.sock")}`;
      expect(factOf(paths, root)).toEqual({
        fact: "owner_state_writable",
        ok: false,
        detail: `control socket directory '${file}' is not a directory`,
      });
      process.env.CRW_FLOW_HOST = `unix://${join(socketDir, "control.sock")}`;
      // before the first binding the flow-bound directory does not exist: it is made in the state directory
      rmSync(state, { recursive: true });
      expect(factOf(paths, root)?.detail).toContain(`flow-bound directory '${state}' does not exist`);
    } finally {
      if (host === undefined) delete process.env.CRW_FLOW_HOST;
      else process.env.CRW_FLOW_HOST = host;
    }
  });
});

describe("crw flow start's preview", () => {
  let fake: FakeAppServer;
  beforeAll(async () => {
    fake = await FakeAppServer.start();
  });
  afterAll(async () => {
    await fake?.stop();
  });

  describe("a start with --pool 8 on three agent threads (--json), and a start with --pool 1 (human)", () => {
    let a: Record<string, unknown>;
    let human: { code: number; stdout: string };
    let state: string;
    const pids: number[] = [];
    let alive: boolean[];

    beforeAll(async () => {
      const env: NodeJS.ProcessEnv = { ...codexHome("[agents]\nmax_threads = 3\n"), CRW_FLOW_HOST: fake.url };
      delete env.CRW_FLOW_FAULT;
      const wf = join(root, "wf.mjs");
      writeFileSync(
        wf,
        `export default { name: "wf", async run(ctx) { return ctx.call({ role: "explorer", task: "t" }); } };`,
      );
      const owner = fake.createOwnerThread({ cwd: root });
      state = join(root, "cli-state");
      const r = await crwFlow(
        ["start", wf, "--owner", owner, "--state", state, "--run", "facts-1", "--pool", "8", "--json"],
        env,
        root,
      );
      expect(r.code, r.stderr).toBe(0);
      a = r.json();
      pids.push(Number(a.pid));
      human = await crwFlow(
        [
          "start",
          wf,
          "--owner",
          fake.createOwnerThread({ cwd: root }),
          "--state",
          state,
          "--run",
          "facts-2",
          "--pool",
          "1",
        ],
        env,
        root,
      );
      const pid2 = Number(/pid (\d+)/.exec(human.stdout)?.[1]);
      if (pid2) pids.push(pid2);
      alive = pids.map((p) => pidAlive(p));
    }, 60_000);

    afterAll(() => {
      for (const p of pids) if (pidAlive(p)) process.kill(p, "SIGKILL");
    });

    it("the pool is min(pool, agents.max_threads - 1): 8 becomes 2, 1 stays 1 (S000-189)", () => {
      expect(a.pool).toBe(2);
      expect(readSpec(runPaths(state, "facts-1").spec).pool).toBe(2);
      expect(readSpec(runPaths(state, "facts-2").spec).pool).toBe(1);
    });

    it("lists each of the six roles' spawn format: spawn_agent(agent_type, message, model, reasoning_effort, fork_context=false) (S000-191)", () => {
      const formats = a.spawn_formats as Array<{
        role: string;
        tool: string;
        arguments: Record<string, unknown>;
      }>;
      expect(formats.map((f) => f.role)).toEqual([
        "architect",
        "executor",
        "executor-t1",
        "reviewer",
        "explorer",
        "critic",
      ]);
      for (const f of formats) {
        expect(f.tool).toBe("spawn_agent");
        expect(Object.keys(f.arguments)).toEqual([
          "agent_type",
          "message",
          "model",
          "reasoning_effort",
          "fork_context",
        ]);
        expect(f.arguments.fork_context).toBe(false);
      }
    });

    it("lists the six session facts, then whether the owner's host can be reached (S000-192)", () => {
      const facts = a.facts as Array<{ fact: string; ok: boolean }>;
      expect(facts.map((f) => f.fact)).toEqual([
        "owner_bound",
        "role_models",
        "owner_state_writable",
        "subagent_slots",
        "multi_agent_v1",
        "verifier_prerequisites",
        "owner_host_reachable",
      ]);
    });

    it("a failing fact is a warning: the runs start and their processes live (S000-306)", () => {
      const facts = a.facts as Array<{ fact: string; ok: boolean }>;
      expect(facts.find((f) => f.fact === "role_models")?.ok).toBe(false);
      expect(human.code).toBe(0);
      expect(human.stdout).toContain("warning: role_models");
      expect(pids).toHaveLength(2);
      expect(alive).toEqual([true, true]);
    });
  });
});

describe("the pool of every resume", () => {
  it("a run process allows at most agents.max_threads - 1 calls in flight whatever the spec's pool says (S000-236)", async () => {
    const run = await inProcessRun({ pool: 8 });
    try {
      const env = codexHome("[agents]\nmax_threads = 3\n");
      const wf = defineWorkflow({
        name: "wide",
        run: async (ctx) =>
          Promise.all(
            [1, 2, 3, 4].map((i) => ctx.call({ role: "explorer", task: `t${i}`, schema: answerSchema })),
          ),
      });
      const done = executeRun({
        paths: run.paths,
        spec: run.spec,
        host: run.host,
        processToken: null,
        workflow: wf,
        env,
      });
      await run.steps(2);
      await new Promise((r) => setTimeout(r, 600));
      expect(listStepFiles(run.paths.steps).steps).toHaveLength(2);
      void done.catch(() => {});
    } finally {
      await run.close();
    }
  });
});
