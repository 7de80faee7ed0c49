import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import {
  codexNativeBin,
  commandJson,
  functionOutputs,
  MockModel,
  type ModelReply,
  type ModelRequest,
  type OwnerModelState,
  ownerModel,
  type RealCodex,
  startRealCodex,
  subagentTurn,
  writeCodexHome,
} from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readLedger } from "../../src/bound/index.js";
import { createAppServerHost } from "../../src/index.js";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow } from "../../src/journal/rows.js";
import { runPaths } from "../../src/run/paths.js";
import { crwBin, crwFlow, ensureBuilt } from "../helpers/cli.js";

/**
 * Bounded owner refusals and an unreachable host, with the real `codex app-server` as host, offline (the
 * in-process versions with a fake host are in test/ownerRefusals.test.ts). The mock Responses model plays
 * an owner that deviates from the role's pair: it spawns every step's subagent with another model than
 * the step's spawn_agent arguments say, and reports it with `crw flow dispatched`. With no spawn hook the
 * real child runs the other model, crw answers pair_mismatch, and after the bound the call is held for a
 * decision; with the hook installed (`crw flow hook install`, a real CLI process) the hook puts the role's
 * pair back into the spawn and the run ends. A run whose host is the default (`codex app-server proxy`)
 * with a CODEX_HOME that has no control socket (an owner whose Codex runs its app-server on stdio) is
 * told so at its start and by `next`.
 *
 * The config's sandbox_mode is the harness's danger-full-access (Codex's Linux sandbox cannot run here).
 */

const schema = { type: "object", required: ["n"], properties: { n: { type: "number" } } };
const workflowSource = `
export default {
  name: "refusals-e2e",
  async run(ctx) {
    return ctx.call({ role: "explorer", task: "Count the files", schema: ${JSON.stringify(schema)} });
  },
};
`;
const roles = { roles: { explorer: { model: "mock-explorer", effort: "low" } } };
/** The model the deviating owner spawns with instead of the role's. */
const OTHER = "mock-other";
const BOUND = 2;

type Row = JournalRow & Record<string, unknown>;

interface Scenario {
  root: string;
  repo: string;
  state: string;
  codex: RealCodex;
  owner: string;
  played: OwnerModelState;
  /** The spawn_agent calls the owner's model made, with the arguments it sent. */
  spawns: Array<Record<string, unknown>>;
  /** The `next` answer that made the owner stop (waiting_decision), if one did. */
  stoppedAt: Record<string, unknown> | null;
  log: string[];
}

const dirs: string[] = [];
/** Run processes a test started that would wait on; ended in afterAll. */
const runPids: number[] = [];
const servers: RealCodex[] = [];
let model: MockModel;
let held: Scenario;
let hooked: Scenario;
const runId = "refusals";

const subagentReply = (request: ModelRequest): ModelReply => {
  const { role } = subagentTurn(request);
  return {
    items: [{ type: "message", text: role === "explorer" ? '{"n":4}' : "{}", phase: "final_answer" }],
    usage: { input: 300, output: 10 },
  };
};

/**
 * The owner of ownerModel, but every spawn_agent it makes names OTHER as its model; it stops (a final
 * message) when `next` answers waiting_decision, as a real owner would tell its user.
 */
function deviatingOwner(startCommand: string, log: string[]) {
  const played = ownerModel({ startCommand, log: (l) => log.push(l), nextWaitSeconds: 2 });
  const spawns: Array<Record<string, unknown>> = [];
  const out = { stoppedAt: null as Record<string, unknown> | null };
  const handler = (request: ModelRequest): ModelReply => {
    const last = functionOutputs(request).at(-1);
    const answer = last ? commandJson(last.output) : null;
    if (answer?.state === "waiting_decision") {
      out.stoppedAt = answer;
      return { items: [{ type: "message", text: `held: ${String(answer.hint)}`, phase: "final_answer" }] };
    }
    const reply = played.handler(request);
    for (const item of reply.items) {
      if (item.type !== "function_call" || item.name !== "spawn_agent") continue;
      item.arguments = { ...(item.arguments as Record<string, unknown>), model: OTHER };
      spawns.push(item.arguments as Record<string, unknown>);
    }
    return reply;
  };
  return { handler, played: played.state, spawns, out };
}

async function runScenario(name: string, hook: boolean): Promise<Scenario> {
  const root = mkdtempSync(join(tmpdir(), `crw-e2e-ref-${name}-`));
  dirs.push(root);
  const repo = join(root, "repo");
  const state = join(root, "state");
  const home = join(root, "home");
  mkdirSync(join(repo, ".crw"), { recursive: true });
  writeFileSync(join(repo, ".crw", "flow-roles.json"), JSON.stringify(roles));
  const workflow = join(root, "count.mjs");
  writeFileSync(workflow, workflowSource);
  const options = { baseUrl: model.baseUrl, models: ["mock-explorer", OTHER] };
  let extraToml = "";
  if (hook) {
    // the install writes into config.toml; the harness writes config.toml again: keep what it appended
    writeCodexHome({ ...options, dir: home });
    const before = readFileSync(join(home, "config.toml"), "utf8");
    const install = await crwFlow([
      "hook",
      "install",
      "--codex-home",
      home,
      "--state",
      state,
      "--codex",
      codexNativeBin(),
      "--cwd",
      repo,
      "--json",
    ]);
    if (install.code !== 0) throw new Error(`hook install failed: ${install.stderr}`);
    expect(install.json()).toMatchObject({ added: true, trusted: true });
    extraToml = readFileSync(join(home, "config.toml"), "utf8").slice(before.length);
  }
  const codex = await startRealCodex({ ...options, home, cwd: repo, listen: "ws", extraToml });
  servers.push(codex);
  const start = [
    process.execPath,
    crwBin,
    "flow start",
    workflow,
    `--state ${state}`,
    `--run ${runId}`,
    `--host ${codex.url}`,
    `--refusal-bound ${BOUND}`,
    "--poll-ms 100",
    "--json",
  ].join(" ");
  const log: string[] = [];
  const owner = (await codex.client.request<{ thread: { id: string } }>("thread/start", { cwd: repo })).thread
    .id;
  const deviating = deviatingOwner(start, log);
  model.on((r) => r.threadId === owner && r.parentThreadId === null, deviating.handler);
  const turn = await codex.client.request<{ turn: { id: string } }>("turn/start", {
    threadId: owner,
    input: [{ type: "text", text: "Run the count workflow with crw flow.", text_elements: [] }],
  });
  try {
    await codex.client.waitTurnCompleted(owner, turn.turn.id, 120_000);
  } finally {
    writeFileSync(join(root, "owner.log"), log.join("\n"));
  }
  return {
    root,
    repo,
    state,
    codex,
    owner,
    played: deviating.played,
    spawns: deviating.spawns,
    stoppedAt: deviating.out.stoppedAt,
    log,
  };
}

const rowsOf = (s: Scenario): Row[] => readJournalFile(runPaths(s.state, runId).journal).rows as Row[];

beforeAll(async () => {
  ensureBuilt();
  model = await MockModel.start();
  model.on((r) => r.parentThreadId !== null, subagentReply);
  [held, hooked] = await Promise.all([runScenario("held", false), runScenario("hook", true)]);
}, 180_000);

afterAll(async () => {
  for (const pid of runPids) {
    try {
      if (pid > 0) process.kill(pid, "SIGTERM");
    } catch {
      // already gone
    }
  }
  for (const codex of servers) await codex.stop();
  await model?.stop();
  if (!process.env.CRW_KEEP_E2E) for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

describe("an owner that spawns with another pair than the role's, real codex as host", () => {
  it(`no spawn hook: after ${BOUND} subagents of the other model the call is held for a decision naming the hook and the role's pair`, async () => {
    const s = held;
    const rows = rowsOf(s);
    const id = "refusals-explorer.1-t1-a1";
    // the owner spawned the bound's number of subagents, each with the other model, and reported each
    expect(s.spawns, s.log.join("\n")).toHaveLength(BOUND);
    for (const args of s.spawns) expect(args).toMatchObject({ model: OTHER, reasoning_effort: "low" });
    expect(s.played.replies.map((r) => r.reply)).toEqual(Array(BOUND).fill("pair_mismatch"));
    // the real app-server lists exactly those subagents for the owner, and they ran the other model
    const host = createAppServerHost({ transport: s.codex.url });
    try {
      const children = await host.listSubagents(s.owner);
      if (!children.ok) throw new Error(children.message);
      expect(children.value).toHaveLength(BOUND);
      for (const child of children.value)
        expect(child).toMatchObject({ model: OTHER, parentThreadId: s.owner });
    } finally {
      await host.close();
    }
    expect(model.requests.filter((r) => r.parentThreadId === s.owner && r.model === "mock-explorer")).toEqual(
      [],
    );
    // the journal: held, the decision, the pause; no end
    expect(rows.find((r) => r.type === "held")).toMatchObject({
      call: "explorer.1",
      reason: "owner_refusals",
      detail: expect.stringMatching(new RegExp(`^${BOUND} pair_mismatch`)),
    });
    const asked = rows.find((r) => r.type === "decision_requested");
    expect(asked).toMatchObject({ decision: id, options: ["retry", "fail"] });
    expect(String(asked?.question)).toMatch(/crw flow hook install/);
    expect(String(asked?.question)).toMatch(/model=mock-explorer reasoning_effort=low/);
    expect(rows.find((r) => r.type === "run_paused")).toMatchObject({ reason: `waiting_decision:${id}` });
    expect(rows.find((r) => r.type === "run_ended")).toBeUndefined();
    // the owner's model stopped at next's waiting_decision; next says so again, with the hint
    expect(s.stoppedAt).toMatchObject({ state: "waiting_decision", decision: { id } });
    const next = await crwFlow(["next", runId, "--state", s.state, "--json"]);
    expect(next.code, next.stderr).toBe(0);
    expect(next.json()).toMatchObject({
      state: "waiting_decision",
      decision: { id, options: ["retry", "fail"], question: asked?.question },
    });
    expect(String(next.json().hint)).toMatch(/crw flow hook install/);
  });

  it("with the spawn hook installed: the hook puts the role's pair into the same deviating spawn, and the run ends", () => {
    const s = hooked;
    const rows = rowsOf(s);
    expect(s.played.failure, s.log.join("\n")).toBeNull();
    expect(s.played.finalState, s.log.join("\n")).toMatchObject({
      state: "ended",
      ended: { status: "completed" },
    });
    expect(rows.find((r) => r.type === "run_ended")).toMatchObject({ status: "completed", result: { n: 4 } });
    expect(rows.find((r) => r.type === "held")).toBeUndefined();
    // one spawn, asked with the other model; the child ran the role's model (the hook's rewrite)
    expect(s.spawns).toHaveLength(1);
    expect(s.spawns[0]).toMatchObject({ model: OTHER });
    // the run also finds the subagent by its marker: a fast one is bound (even harvested, the run ended)
    // before the owner's report lands, which is then answered close (the attempt ended) or queued (no
    // process of the run is left); never a refusal
    expect(s.played.replies, JSON.stringify(s.played.replies)).toHaveLength(1);
    expect(["bound", "close", "queued"]).toContain(s.played.replies[0]?.reply);
    const childRequests = model.requests.filter((r) => r.parentThreadId === s.owner);
    expect(childRequests.length).toBeGreaterThan(0);
    for (const r of childRequests) expect(r.model).toBe("mock-explorer");
    // the hook's ledger: what the owner sent and the role's pair it applied
    expect(readLedger(s.state, s.owner)).toMatchObject([
      {
        run_id: runId,
        decision: "allow",
        role: "explorer",
        op: "explorer.1/t1-a1",
        sent: { model: OTHER, effort: "low" },
        applied: { model: "mock-explorer", effort: "low" },
      },
    ]);
  });
});

describe("a host on stdio only (no control socket), real codex binary", () => {
  it("the start's facts warn of the missing control socket, and next says why the run cannot reach the host", async () => {
    const root = mkdtempSync(join(tmpdir(), "crw-e2e-ref-stdio-"));
    dirs.push(root);
    const home = join(root, "home");
    const state = join(root, "state");
    mkdirSync(home);
    mkdirSync(join(root, ".crw"));
    writeFileSync(join(root, ".crw", "flow-roles.json"), JSON.stringify(roles));
    const workflow = join(root, "count.mjs");
    writeFileSync(workflow, workflowSource);
    const socket = join(home, "app-server-control", "app-server-control.sock");
    // the real codex on PATH: the run's host command `codex app-server proxy` finds no socket to bridge to
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      CODEX_HOME: home,
      CODEX_THREAD_ID: "019a0000-0000-7000-8000-000000000001",
      PATH: `${dirname(codexNativeBin())}:${process.env.PATH ?? ""}`,
    };
    delete env.CRW_FLOW_HOST;
    delete env.CRW_FLOW_FAULT;
    const started = await crwFlow(
      ["start", workflow, "--state", state, "--run", "stdio", "--poll-ms", "100", "--json"],
      env,
      root,
    );
    expect(started.code, started.stderr).toBe(0);
    // the run's process would wait on: afterAll ends it (the process this test started, by its pid)
    runPids.push(Number(started.json().pid));
    const facts = started.json().facts as Array<{ fact: string; ok: boolean; detail: string }>;
    expect(facts).toHaveLength(7);
    const fact = facts.find((f) => f.fact === "owner_host_reachable");
    expect(fact).toMatchObject({ ok: false });
    expect(fact?.detail).toContain(socket);
    // the run's process tries the host in its lookups; next tells the owner why it cannot
    let next: Record<string, unknown> = {};
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      const r = await crwFlow(["next", "stdio", "--state", state, "--json"], env, root);
      next = r.json();
      if ((next.host as { reachable?: boolean } | undefined)?.reachable === false) break;
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
    expect(next.host).toMatchObject({
      reachable: false,
      host: "codex app-server proxy",
      why: `there is no control socket at ${socket}: the owner's Codex runs its app-server on stdio (as an IDE extension does), or no Codex CLI runs with this CODEX_HOME`,
      fix: expect.stringMatching(/--listen ws:\/\/127\.0\.0\.1:PORT/),
    });
    // the hint starts with the diagnosis; the ask that first tells it is a change, not a repeat
    expect(String(next.hint)).toMatch(/^crw cannot reach the owner's Codex host codex app-server proxy: /);
    expect(String(next.hint)).not.toMatch(/Nothing changed/);
    const again = (await crwFlow(["next", "stdio", "--state", state, "--json"], env, root)).json();
    expect(again.host).toMatchObject({ reachable: false });
    expect(String(again.hint)).toMatch(/^crw cannot reach the owner's Codex host/);
    const warning = readJournalFile(runPaths(state, "stdio").journal).rows.find(
      (r) => r.type === "flow_warning" && (r as Row).warning === "host_unreachable",
    ) as Row | undefined;
    expect(warning?.detail).toMatchObject({
      host: "codex app-server proxy",
      why: expect.stringContaining(socket),
    });
  }, 60_000);
});
