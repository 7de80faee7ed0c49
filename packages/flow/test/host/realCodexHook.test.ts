import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  functionOutputs,
  MockModel,
  type RealCodex,
  startRealCodex,
  toolNamespace,
  trustHooks,
} from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createAppServerHost, type SessionHost } from "../../src/index.js";

/**
 * The mechanism issue 4's spawn hook stands on, against the real app-server: a PreToolUse command hook on
 * spawn_agent, trusted through hooks/list + `[hooks.state."<key>"] trusted_hash`, sees the spawn's input on
 * stdin and either rewrites its model and effort or refuses it. (The hook here is a small script; crw's own
 * `crw flow hook pre-tool-use` is the engine's.)
 */

let model: MockModel;
let codex: RealCodex;
let root: string;
let host: SessionHost;
let owner: string;
const spawnOutputs: string[] = [];

const hookScript = `
import { appendFileSync, readFileSync } from "node:fs";
const input = JSON.parse(readFileSync(0, "utf8"));
appendFileSync(process.env.HOOK_LOG, JSON.stringify(input) + "\\n");
const message = String(input.tool_input?.message ?? "");
const decision = message.includes("deny-me")
  ? { hookEventName: "PreToolUse", permissionDecision: "deny", permissionDecisionReason: "leaf subagents never spawn" }
  : {
      hookEventName: "PreToolUse",
      permissionDecision: "allow",
      updatedInput: { ...input.tool_input, model: "mock-rewritten", reasoning_effort: "low" },
    };
process.stdout.write(JSON.stringify({ hookSpecificOutput: decision }));
`;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "crw-real-codex-hook-"));
  const hook = join(root, "hook.mjs");
  writeFileSync(hook, hookScript);
  model = await MockModel.start();
  model.on(
    (r) => r.parentThreadId !== null,
    () => ({ items: [{ type: "message", text: '{"ok":true}', phase: "final_answer" }] }),
  );
  model.otherwise((request) => {
    const outputs = functionOutputs(request);
    if (outputs.length > 0) spawnOutputs[outputs.length - 1] = outputs.at(-1)?.output ?? "";
    const spawn = (message: string) => ({
      items: [
        {
          type: "function_call" as const,
          name: "spawn_agent",
          namespace: toolNamespace(request, "spawn_agent"),
          arguments: { message, model: "mock-asked", reasoning_effort: "high" },
        },
      ],
    });
    if (outputs.length === 0) return spawn("crw-flow-op: review.1/t1-a1\nCRW-ROLE: reviewer\n\nwork");
    if (outputs.length === 1) return spawn("deny-me please");
    return { items: [{ type: "message", text: "done", phase: "final_answer" }] };
  });
  const extraToml = `
[[hooks.PreToolUse]]
matcher = "spawn_agent"
[[hooks.PreToolUse.hooks]]
type = "command"
command = ${JSON.stringify(`${process.execPath} ${hook}`)}
timeout = 10
`;
  const started = await startRealCodex({
    home: join(root, "home"),
    cwd: root,
    baseUrl: model.baseUrl,
    models: ["mock-asked", "mock-rewritten"],
    extraToml,
    env: { HOOK_LOG: join(root, "hook.log") },
  });
  const trusted = await trustHooks(started, root);
  codex = trusted.codex;
  expect(trusted.trusted).toHaveLength(1);
  host = createAppServerHost({ transport: codex.url });
  owner = (await codex.client.request<{ thread: { id: string } }>("thread/start", { cwd: root })).thread.id;
  const turn = await codex.client.request<{ turn: { id: string } }>("turn/start", {
    threadId: owner,
    input: [{ type: "text", text: "spawn", text_elements: [] }],
  });
  await codex.client.waitTurnCompleted(owner, turn.turn.id, 60_000);
}, 120_000);

afterAll(async () => {
  await host?.close();
  await codex?.stop();
  await model?.stop();
  if (root) rmSync(root, { recursive: true, force: true });
});

describe("a trusted PreToolUse hook on spawn_agent, real codex", () => {
  it("sees the spawn on stdin: tool name, the owner's session, the message, model and effort", () => {
    const calls = readFileSync(join(root, "hook.log"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(calls).toHaveLength(2);
    expect(calls[0]).toMatchObject({
      hook_event_name: "PreToolUse",
      tool_name: "spawn_agent",
      session_id: owner,
      tool_input: {
        message: expect.stringContaining("crw-flow-op: review.1/t1-a1"),
        model: "mock-asked",
        reasoning_effort: "high",
      },
    });
  });

  it("an allow with updatedInput runs the child with the rewritten model and effort", async () => {
    const children = await host.listSubagents(owner);
    if (!children.ok) throw new Error(children.message);
    expect(children.value).toHaveLength(1);
    expect(children.value[0]).toMatchObject({
      model: "mock-rewritten",
      reasoningEffort: "low",
      parentThreadId: owner,
    });
  });

  it("a deny blocks the spawn and the owner's model reads the reason", () => {
    expect(spawnOutputs[1]).toContain("leaf subagents never spawn");
    expect(spawnOutputs[1]).not.toContain("agent_id");
  });
});
