import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  codexNativeBin,
  functionOutputs,
  MockModel,
  type ModelRequest,
  type RealCodex,
  startRealCodex,
  toolNamespace,
  writeCodexHome,
} from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bindOrchestrator, helperPairsFrom, readLedger, spawnsOfOp } from "../../src/bound/index.js";
import { runPaths } from "../../src/run/paths.js";
import { crwBin, ensureBuilt } from "../helpers/cli.js";

/**
 * The spawn hook in the real `codex app-server` of the pinned package, offline: `crw flow hook install`
 * (a real CLI process) puts it in a CODEX_HOME and trusts it; an owner thread bound to a run spawns
 * through the mock model; the hook (the built CLI, run by codex) rewrites one spawn's model and effort,
 * refuses a full-history fork, and refuses the spawn a subagent tries (agents.max_depth lets it try).
 */
const reviewMessage = "crw-flow-op: review/t1-a1\nCRW-ROLE: reviewer\n\nRead the packet and answer JSON.";
const forkMessage = "crw-flow-op: fork/t1-a1\nCRW-ROLE: explorer\n\nfork";

let model: MockModel;
let codex: RealCodex;
let root: string;
let home: string;
let state: string;
let ownerId: string;
let installed: Record<string, unknown>;
const outputs: Record<string, string> = {};

function ownerStep(r: ModelRequest) {
  const outs = functionOutputs(r);
  const spawn = (args: Record<string, unknown>) => ({
    items: [
      {
        type: "function_call" as const,
        name: "spawn_agent",
        namespace: toolNamespace(r, "spawn_agent"),
        arguments: args,
      },
    ],
  });
  if (outs.length === 0)
    return spawn({
      message: reviewMessage,
      agent_type: "explorer",
      model: "mock-model",
      reasoning_effort: "low",
    });
  if (outs.length === 1) {
    outputs.review = outs[0]?.output ?? "";
    return spawn({ message: forkMessage, fork_context: true });
  }
  if (outs.length === 2) {
    outputs.fork = outs[1]?.output ?? "";
    const id = (JSON.parse(outputs.review ?? "{}") as { agent_id: string }).agent_id;
    return {
      items: [
        {
          type: "function_call" as const,
          name: "wait_agent",
          namespace: toolNamespace(r, "wait_agent"),
          arguments: { targets: [id], timeout_ms: 30_000 },
        },
      ],
    };
  }
  outputs.wait = outs[2]?.output ?? "";
  return { items: [{ type: "message" as const, text: "done", phase: "final_answer" as const }] };
}

function crw(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [crwBin, ...args], (err, stdout, stderr) =>
      resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });
}

beforeAll(async () => {
  ensureBuilt();
  model = await MockModel.start();
  // the subagent tries a spawn of its own (a leaf must not), then answers what the spawn returned
  model.on(
    (r) =>
      r.parentThreadId !== null &&
      functionOutputs(r).length === 0 &&
      r.tools.some((t) => JSON.stringify(t).includes("spawn_agent")),
    (r) => ({
      items: [
        {
          type: "function_call",
          name: "spawn_agent",
          namespace: toolNamespace(r, "spawn_agent"),
          arguments: { message: "crw-flow-op: deeper/t1-a1\nCRW-ROLE: explorer\n\nx" },
        },
      ],
    }),
  );
  model.on(
    (r) => r.parentThreadId !== null,
    (r) => ({
      items: [
        {
          type: "message",
          text: JSON.stringify({ leaf_spawn: functionOutputs(r)[0]?.output ?? "no spawn tool" }),
          phase: "final_answer",
        },
      ],
    }),
  );
  model.otherwise(ownerStep);
  root = mkdtempSync(join(tmpdir(), "crw-codex-hook-"));
  home = join(root, "codex-home");
  state = join(root, "state");
  mkdirSync(home);
  const extraBase = "\n[agents]\nmax_depth = 2\n";
  const options = { baseUrl: model.baseUrl, models: ["mock-reviewer"], extraToml: extraBase };
  writeCodexHome({ ...options, dir: home });
  const before = readFileSync(join(home, "config.toml"), "utf8");
  const install = await crw([
    "flow",
    "hook",
    "install",
    "--codex-home",
    home,
    "--state",
    state,
    "--codex",
    codexNativeBin(),
    "--cwd",
    root,
    "--json",
  ]);
  if (install.code !== 0) throw new Error(`install failed: ${install.stderr}`);
  installed = JSON.parse(install.stdout) as Record<string, unknown>;
  const after = readFileSync(join(home, "config.toml"), "utf8");
  // the harness writes config.toml again: the same base and what the install appended
  codex = await startRealCodex({
    ...options,
    extraToml: extraBase + after.slice(before.length),
    home,
    cwd: root,
    listen: "ws",
  });
  const started = await codex.client.request<{ thread: { id: string } }>("thread/start", { cwd: root });
  ownerId = started.thread.id;
  // the owner is bound to a live run (its process holds the run lock)
  const paths = runPaths(state, "run-hook");
  mkdirSync(paths.dir, { recursive: true });
  writeFileSync(paths.runLock, JSON.stringify({ pid: process.pid }));
  const bound = bindOrchestrator({
    state,
    owner: ownerId,
    runId: "run-hook",
    policyDigest: "digest-hook",
    helperPairs: helperPairsFrom({ reviewer: { model: "mock-reviewer", effort: "high" } }),
  });
  if (!bound.bound) throw new Error(bound.message);
  const turn = await codex.client.request<{ turn: { id: string } }>("turn/start", {
    threadId: ownerId,
    input: [{ type: "text", text: "run the workflow", text_elements: [] }],
  });
  await codex.client.waitTurnCompleted(ownerId, turn.turn.id, 90_000);
}, 180_000);

afterAll(async () => {
  await codex?.stop();
  await model?.stop();
  if (root) rmSync(root, { recursive: true, force: true });
});

describe("the spawn hook in the real codex", () => {
  it("crw flow hook install adds the hook and trusts it by the key and hash hooks/list gives", async () => {
    expect(installed).toMatchObject({ added: true, trusted: true, restartNeeded: true });
    expect(installed.key).toMatch(/config\.toml:pre_tool_use:0:0$/);
    expect(installed.hash).toMatch(/^sha256:/);
    const list = await codex.client.request<{ data: Array<{ hooks: Array<Record<string, unknown>> }> }>(
      "hooks/list",
      {
        cwds: [root],
      },
    );
    const hook = list.data[0]?.hooks.find((h) => h.key === installed.key);
    expect(hook).toMatchObject({
      trustStatus: "trusted",
      matcher: "spawn_agent",
      currentHash: installed.hash,
    });
    // installing again changes nothing
    const again = await crw([
      "flow",
      "hook",
      "install",
      "--codex-home",
      home,
      "--state",
      state,
      "--codex",
      codexNativeBin(),
      "--cwd",
      root,
      "--json",
    ]);
    expect(JSON.parse(again.stdout)).toMatchObject({ added: false, trusted: false, restartNeeded: false });
  }, 60_000);

  it("the hook rewrites the spawn's model and effort from the reviewer's pair: the child runs mock-reviewer/high (S000-277)", async () => {
    const agentId = (JSON.parse(outputs.review ?? "{}") as { agent_id?: string }).agent_id;
    expect(agentId).toBeTruthy();
    const child = await codex.client.request<{ thread: Record<string, unknown> }>("thread/read", {
      threadId: agentId,
      includeTurns: false,
    });
    expect(child.thread).toMatchObject({ parentThreadId: ownerId });
    const requests = model.requests.filter((r) => r.threadId === agentId);
    expect(requests.length).toBeGreaterThan(0);
    expect(requests[0]?.model).toBe("mock-reviewer");
    expect(JSON.stringify(requests[0]?.body.reasoning ?? {})).toContain("high");
    const ledger = readLedger(state, ownerId);
    expect(ledger[0]).toMatchObject({
      run_id: "run-hook",
      decision: "allow",
      role: "reviewer",
      op: "review/t1-a1",
      agent_type: "explorer",
      sent: { model: "mock-model", effort: "low" },
      applied: { model: "mock-reviewer", effort: "high" },
      warnings: ["role_agent_type_mismatch"],
    });
  });

  it("the ledger's op joins the owner turn's collabAgentToolCall spawn item: the step's subagent after a restart", async () => {
    const agentId = (JSON.parse(outputs.review ?? "{}") as { agent_id?: string }).agent_id;
    const owner = await codex.client.request<{
      thread: { turns: Array<{ items: Array<Record<string, unknown>> }> };
    }>("thread/read", { threadId: ownerId, includeTurns: true });
    const items = owner.thread.turns.flatMap((t) => t.items) as Array<{ type: string; id: string }>;
    const joined = spawnsOfOp(readLedger(state, ownerId), items, "review/t1-a1");
    expect(joined.map((j) => j.agentId)).toEqual([agentId]);
    expect(spawnsOfOp(readLedger(state, ownerId), items, "fork/t1-a1")).toEqual([]);
  });

  it("the hook refuses a full-history fork; the owner's model reads the refusal (S000-276)", async () => {
    expect(outputs.fork).toMatch(/blocked by PreToolUse hook: full_history_fork_refused/);
    expect(readLedger(state, ownerId).find((l) => l.op === "fork/t1-a1")).toMatchObject({
      decision: "deny",
      reason: "full_history_fork_refused",
    });
  });

  it("the hook refuses the spawn a subagent of the bound owner tries (a leaf) (S000-275)", async () => {
    expect(outputs.wait).toMatch(/leaf_spawn_refused/);
    expect(readLedger(state, ownerId).find((l) => l.op === "deeper/t1-a1")).toMatchObject({
      decision: "deny",
      reason: "leaf_spawn_refused",
    });
  });
});
