import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import {
  MockModel,
  type ModelReply,
  type ModelRequest,
  type OwnerModelState,
  ownerModel,
  type RealCodex,
  startRealCodex,
  subagentTurn,
} from "@crw/tools/codex";
import { ensureBuilt } from "../helpers/cli.js";

/**
 * The scenario of the end-to-end tests with the real `codex app-server` as host: a workflow with one call
 * and then a parallel pair, a role store with mock models, the mock model playing the owner (through
 * Codex's shell and multi-agent tools) and the subagents (JSON answers; the explorer's first answer is not
 * JSON, so the repair runs).
 */

const here = dirname(fileURLToPath(import.meta.url));
const repoRoot = resolve(here, "../../../..");

/** Codex names a rollout `rollout-<time>-<thread id>.jsonl`. */
export const codexThreadIdOf = (rolloutPath: string) =>
  /-([0-9a-f-]{36})\.jsonl$/.exec(rolloutPath)?.[1] ?? "";
const crwBin = join(repoRoot, "apps/crw/bin/crw.mjs");

const workflowSource = `
export default {
  name: "e2e-review",
  async run(ctx, input) {
    const plan = await ctx.call({
      role: "architect",
      task: "Plan the change: " + input.topic,
      schema: { type: "object", required: ["steps"], properties: { steps: { type: "array", items: { type: "string" } } } },
    });
    const [found, review] = await Promise.all([
      ctx.call({
        role: "explorer",
        task: "Find where " + plan.steps[0] + " happens",
        schema: { type: "object", required: ["finding"], properties: { finding: { type: "string" } } },
      }),
      ctx.call({
        role: "reviewer",
        task: "Review the plan " + plan.steps.join(", "),
        schema: { type: "object", required: ["verdict"], properties: { verdict: { enum: ["ok", "bad"] } } },
      }),
    ]);
    return { steps: plan.steps, finding: found.finding, verdict: review.verdict };
  },
};
`;

const roles = {
  roles: {
    architect: { model: "mock-architect", effort: "high" },
    explorer: { model: "mock-explorer", effort: "low" },
    reviewer: { model: "mock-reviewer" },
  },
};

const agentRolesToml = ["architect", "reviewer", "executor"]
  .map((role) => `\n[agents.${role}]\ndescription = "crw flow ${role}"\n`)
  .join("");

const subUsage = { input: 1000, cached_input: 200, output: 50, reasoning_output: 10 };

/** The subagents: JSON answers by role; the explorer's first answer is not JSON. */
function subagentReply(request: ModelRequest, explorerTurns: { n: number }): ModelReply {
  const { role, marker } = subagentTurn(request);
  const answer = (text: string): ModelReply => ({
    items: [
      { type: "message", text: "Reading the packet.", phase: "commentary" },
      { type: "message", text, phase: "final_answer" },
    ],
    usage: subUsage,
  });
  if (role === "architect")
    return answer('Here is the plan: {"steps":["parse the input","write the output"]}');
  if (role === "explorer") {
    explorerTurns.n++;
    if (marker?.includes("/t1-")) return answer("I looked around but I am not sure.");
    return answer('{"finding":"src/parse.ts:12"}');
  }
  if (role === "reviewer") {
    return {
      ...answer('{"verdict":"ok"}'),
      usage: { input: 1000, cached_input: 0, output: 50, reasoning_output: 0 },
    };
  }
  return answer("{}");
}

export const expectedResult = {
  steps: ["parse the input", "write the output"],
  finding: "src/parse.ts:12",
  verdict: "ok",
};

export interface CodexScenario {
  root: string;
  state: string;
  repo: string;
  owner: OwnerModelState;
  ownerThreadId: string;
  ownerLog: string[];
  explorerTurns: { n: number };
  codex: RealCodex;
  model: MockModel;
  stop(): Promise<void>;
}

/**
 * Runs the scenario until the owner's turn ends. `startPrefix` goes before the start command in the
 * owner's shell (e.g. `CRW_FLOW_FAULT=after:turn_started:1`: only the run's first process gets it; the
 * process `next` resumes inherits the owner's shell, which has no such variable). `subagent` answers the
 * subagents' model requests in place of the scenario's answers (a reply that never comes keeps a turn
 * running); `during` runs beside the owner's turn, with the run's id once the owner has started it.
 */
export async function runCodexScenario(
  options: {
    startPrefix?: string;
    subagent?: (request: ModelRequest) => ModelReply | Promise<ModelReply>;
    during?: (run: { state: string; runId: () => string | undefined }) => Promise<void>;
  } = {},
): Promise<CodexScenario> {
  ensureBuilt();
  const root = mkdtempSync(join(tmpdir(), "crw-e2e-codex-"));
  const repo = join(root, "repo");
  const state = join(root, "state");
  mkdirSync(join(repo, ".crw"), { recursive: true });
  writeFileSync(join(repo, ".crw", "flow-roles.json"), JSON.stringify(roles));
  const workflow = join(repo, "review.mjs");
  writeFileSync(workflow, workflowSource);
  const model = await MockModel.start();
  const codex = await startRealCodex({
    home: join(root, "codex-home"),
    cwd: repo,
    baseUrl: model.baseUrl,
    models: ["mock-architect", "mock-explorer", "mock-reviewer"],
    listen: "ws",
    // The agent types crw's roles spawn as are Codex roles of their own (built-ins: default, explorer, worker).
    extraToml: agentRolesToml,
  });
  const stop = async () => {
    await codex.stop();
    await model.stop();
    if (!process.env.CRW_KEEP_E2E) rmSync(root, { recursive: true, force: true });
  };
  const start = [
    ...(options.startPrefix ? [options.startPrefix] : []),
    process.execPath,
    crwBin,
    "flow start",
    workflow,
    `--input '{"topic":"csv export"}'`,
    `--state ${state}`,
    `--host ${codex.url}`,
    "--poll-ms 100",
    "--json",
  ].join(" ");
  const ownerLog: string[] = [];
  const explorerTurns = { n: 0 };
  const played = ownerModel({ startCommand: start, log: (l) => ownerLog.push(l) });
  model.on(
    (r) => r.parentThreadId !== null,
    (r) => (options.subagent ? options.subagent(r) : subagentReply(r, explorerTurns)),
  );
  model.otherwise(played.handler);
  const started = await codex.client.request<{ thread: { id: string } }>("thread/start", { cwd: repo });
  const ownerThreadId = started.thread.id;
  const turn = await codex.client.request<{ turn: { id: string } }>("turn/start", {
    threadId: ownerThreadId,
    input: [{ type: "text", text: "Run the review workflow with crw flow.", text_elements: [] }],
  });
  // held as a value until the owner's turn is over, so an early failure is never an unhandled rejection
  const beside = (
    options.during?.({ state, runId: () => played.state.runId ?? undefined }) ?? Promise.resolve()
  ).then(
    () => null,
    (e: unknown) => e as Error,
  );
  try {
    await codex.client.waitTurnCompleted(ownerThreadId, turn.turn.id, 150_000);
    const failed = await beside;
    if (failed) throw failed;
  } catch (e) {
    writeFileSync(join(root, "owner.log"), ownerLog.join("\n"));
    await codex.stop();
    await model.stop();
    throw new Error(`the owner's turn did not end: ${(e as Error).message}; owner log in ${root}/owner.log`);
  }
  writeFileSync(join(root, "owner.log"), ownerLog.join("\n"));
  return {
    root,
    state,
    repo,
    owner: played.state,
    ownerThreadId,
    ownerLog,
    explorerTurns,
    codex,
    model,
    stop,
  };
}
