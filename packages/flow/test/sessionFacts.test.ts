import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  bindRunOwner,
  executeRun,
  listStepFiles,
  readCodexSettings,
  resolveTable,
  runPaths,
  sessionFacts,
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
  it("S000-190: agents.max_threads is read from <CODEX_HOME>/config.toml, default 6; [agents.<type>] tables are the configured agent types", () => {
    expect(readCodexSettings(codexHome("")).maxThreads).toBe(6);
    const s = readCodexSettings(
      codexHome(
        '[agents]\nmax_threads = 4 # four\n\n[agents.architect]\ndescription = "a"\n[agents."reviewer"]\n[features]\nmulti_agent_v2 = true\n',
      ),
    );
    expect(s).toMatchObject({ maxThreads: 4, multiAgentV2: true, agentTypes: ["architect", "reviewer"] });
  });

  it("S000-192 S000-313 S000-308 S000-311 S000-312: six facts, verifier_prerequisites judged for every run; a role without a model or effort and a refused agent_type are flagged", () => {
    const { facts } = factsFor("[agents]\nmax_threads = 6\n");
    expect(facts.map((f) => f.fact)).toEqual([
      "owner_bound",
      "role_models",
      "owner_state_writable",
      "subagent_slots",
      "multi_agent_v1",
      "verifier_prerequisites",
    ]);
    const byFact = Object.fromEntries(facts.map((f) => [f.fact, f]));
    expect(byFact.owner_bound?.ok).toBe(true);
    expect(byFact.role_models?.ok).toBe(false);
    expect(byFact.role_models?.detail).toContain("architect has no model");
    // the real host refuses agent_type architect/reviewer/executor unless [agents.<type>] is configured
    expect(byFact.role_models?.detail).toContain("agent_type architect");
    expect(byFact.role_models?.detail).toContain("[agents.executor]");
    expect(byFact.subagent_slots?.ok).toBe(true);
    expect(byFact.multi_agent_v1?.ok).toBe(true);
    expect(byFact.verifier_prerequisites?.ok).toBe(true);

    const all = Object.fromEntries(
      ["architect", "executor", "executor-t1", "reviewer", "explorer", "critic"].map((r) => [
        r,
        { model: "m", effort: "high" },
      ]),
    );
    const good = factsFor(
      "[agents]\nmax_threads = 1\n[agents.architect]\n[agents.executor]\n[agents.reviewer]\n[agents.critic]\n[features]\nmulti_agent_v2 = true\n",
      { ...all, critic: { model: "m", effort: "high", agent_type: "critic" } },
      { verifier: { go_root: join(root, "no-go") } },
    ).facts;
    const g = Object.fromEntries(good.map((f) => [f.fact, f]));
    expect(g.role_models?.ok).toBe(true);
    expect(g.subagent_slots).toMatchObject({ ok: false });
    expect(g.multi_agent_v1).toMatchObject({ ok: false, detail: expect.stringContaining("multi_agent_v2") });
    expect(g.verifier_prerequisites).toMatchObject({ ok: false, detail: expect.stringContaining("no-go") });
    const goRoot = join(root, "go");
    mkdirSync(join(goRoot, "bin"), { recursive: true });
    writeFileSync(join(goRoot, "bin", "go"), "#!/bin/sh\n");
    chmodSync(join(goRoot, "bin", "go"), 0o755);
    const withGo = factsFor("", all, { verifier: { go_root: goRoot } }).facts;
    expect(withGo.find((f) => f.fact === "verifier_prerequisites")?.ok).toBe(true);
  });

  it("S000-310: owner_state_writable names the run directory, the flow-bound directory and the repository", () => {
    const { facts } = factsFor("");
    const f = facts.find((x) => x.fact === "owner_state_writable");
    expect(f?.ok).toBe(true);
    expect(f?.detail).toContain("flow-bound");
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

  it("S000-189 S000-191 S000-192 S000-306: the pool is min(pool, max_threads - 1), six spawn formats, six facts as warnings; the run starts", async () => {
    const env: NodeJS.ProcessEnv = { ...codexHome("[agents]\nmax_threads = 3\n"), CRW_FLOW_HOST: fake.url };
    delete env.CRW_FLOW_FAULT;
    const wf = join(root, "wf.mjs");
    writeFileSync(
      wf,
      `export default { name: "wf", async run(ctx) { return ctx.call({ role: "explorer", task: "t" }); } };`,
    );
    const owner = fake.createOwnerThread({ cwd: root });
    const state = join(root, "cli-state");
    const r = await crwFlow(
      ["start", wf, "--owner", owner, "--state", state, "--run", "facts-1", "--pool", "8", "--json"],
      env,
      root,
    );
    expect(r.code, r.stderr).toBe(0);
    const a = r.json();
    try {
      expect(a.pool).toBe(2);
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
        expect(Object.keys(f.arguments)).toEqual(
          expect.arrayContaining(["agent_type", "message", "fork_context"]),
        );
        expect(f.arguments.fork_context).toBe(false);
      }
      const facts = a.facts as Array<{ fact: string; ok: boolean }>;
      // the seed's six, then crw's seventh: whether the owner's host can be reached
      expect(facts).toHaveLength(7);
      expect(facts[6]?.fact).toBe("owner_host_reachable");
      expect(facts.find((f) => f.fact === "role_models")?.ok).toBe(false); // a warning; the run started
      const human = await crwFlow(
        ["start", wf, "--owner", fake.createOwnerThread({ cwd: root }), "--state", state, "--run", "facts-2"],
        env,
        root,
      );
      expect(human.code).toBe(0);
      expect(human.stdout).toContain("warning: role_models");
      const pid2 = Number(/pid (\d+)/.exec(human.stdout)?.[1]);
      if (pid2) process.kill(pid2, "SIGKILL");
    } finally {
      process.kill(Number(a.pid), "SIGKILL");
    }
  });
});

describe("the pool of every resume", () => {
  it("S000-236: a run process allows at most agents.max_threads - 1 calls in flight whatever the spec's pool says", async () => {
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
