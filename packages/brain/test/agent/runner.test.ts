import { existsSync, mkdtempSync, readFileSync, realpathSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TranscriptMessage } from "@crw/db";
import { afterAll, describe, expect, it } from "vitest";
import { createAgentTurnRunner, modelConfigFor } from "../../src/agent/index.js";
import type { TurnHost, TurnRequest, TurnTool } from "../../src/delegation/index.js";
import { captureDelegatedExecutionScope, parseDelegatedExecutionScope } from "../../src/scope/index.js";

const dir = realpathSync(mkdtempSync(join(tmpdir(), "crw-runner-")));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Records the order in which the runner talks to its host. */
function recordingHost(steer: TranscriptMessage[][] = []) {
  const log: string[] = [];
  const host: TurnHost = {
    record: async (m) => {
      log.push(
        m.role === "assistant"
          ? `record:assistant:${m.content.map((c) => (c.type === "text" ? c.text : c.name)).join(",")}`
          : `record:toolResult:${m.toolName}${m.details ? `:${m.details.resultId}` : ""}`,
      );
    },
    beforeToolCall: async (call) => {
      log.push(`intent:${call.name}`);
    },
    drainSteering: async () => {
      log.push("drain");
      return steer.shift() ?? [];
    },
    progress: (e) => {
      if (e.type === "tool") log.push(`progress:tool:${e.toolName}`);
    },
  };
  return { host, log };
}

const resultId = "6a0c4c1e-9d0e-4a55-9d2c-4b8a1c0f7e21";
const delegateTool: TurnTool = {
  name: "Delegate",
  description: "Delegate a task",
  parameters: { type: "object", properties: { task: { type: "string" } }, required: ["task"] },
  execute: async (args) => ({ content: `child answered ${String(args.task)}`, details: { resultId } }),
};

function request(overrides: Partial<TurnRequest> = {}): TurnRequest {
  const scope = parseDelegatedExecutionScope(
    captureDelegatedExecutionScope({ accountId: "acct", target: { kind: "host", ref: null }, workDir: dir }),
  );
  return {
    sessionId: "11111111-2222-4333-8444-555555555555",
    principalAccountId: "acct",
    model: "scripted:plan",
    systemPrompt: "worker",
    context: [{ role: "user", content: "task" }],
    tools: [delegateTool],
    scope,
    readOnly: false,
    workDir: dir,
    signal: new AbortController().signal,
    ...overrides,
  };
}

describe("createAgentTurnRunner (the delegation core's turn seam on the real agent loop)", () => {
  it("records each reply before its tools run, each intent before its tool, each result before the next tool, and drains steering after the tool round", async () => {
    const runner = createAgentTurnRunner({
      scripts: {
        plan: [
          {
            toolCalls: [
              { name: "write", arguments: { path: "out.txt", content: "x" } },
              { name: "Delegate", arguments: { task: "sub" } },
            ],
          },
          { text: "final {{last}}" },
        ],
      },
    });
    const steered: TranscriptMessage = {
      role: "custom",
      customType: "delegation_result",
      content: "late result",
    };
    const { host, log } = recordingHost([[steered]]);
    const outcome = await runner.runTurn(request(), host);
    expect(outcome).toEqual({ stopReason: "stop" });
    expect(log).toEqual([
      "record:assistant:write,Delegate",
      "progress:tool:write",
      "intent:write",
      "record:toolResult:write",
      "progress:tool:Delegate",
      "intent:Delegate",
      `record:toolResult:Delegate:${resultId}`,
      "drain",
      "record:assistant:final late result",
    ]);
    expect(readFileSync(join(dir, "out.txt"), "utf8")).toBe("x");
  });

  it("returns provider failures and bad model names as outcomes", async () => {
    const runner = createAgentTurnRunner({
      scripts: { fail: [{ stopReason: "error", errorMessage: "overloaded" }] },
    });
    expect(await runner.runTurn(request({ model: "scripted:fail" }), recordingHost().host)).toEqual({
      stopReason: "error",
      errorMessage: "overloaded",
    });
    expect((await runner.runTurn(request({ model: "mystery:1" }), recordingHost().host)).stopReason).toBe(
      "error",
    );
  });

  it("gives a session without a workDir no child tools", async () => {
    const runner = createAgentTurnRunner({
      scripts: {
        w: [{ toolCalls: [{ name: "write", arguments: { path: "no.txt", content: "x" } }] }, { text: "." }],
      },
    });
    const { host, log } = recordingHost();
    await runner.runTurn(request({ model: "scripted:w", workDir: null, scope: null }), host);
    expect(existsSync(join(dir, "no.txt"))).toBe(false);
    expect(log).not.toContain("intent:write");
  });

  it("maps model names to provider configurations", () => {
    expect(modelConfigFor("scripted")).toEqual({ api: "scripted" });
    expect(
      modelConfigFor("anthropic-messages:claude-x", {
        baseUrls: { "anthropic-messages": "http://127.0.0.1:9" },
      }),
    ).toEqual({
      api: "anthropic-messages",
      modelId: "claude-x",
      baseUrl: "http://127.0.0.1:9",
    });
    expect(() => modelConfigFor("openai-responses:")).toThrow(/names no model id/);
  });
});

describe("child tools only where their files are", () => {
  it("a child placed on a managed guest or a paired computer gets no host file tools", async () => {
    const runner = createAgentTurnRunner({
      scripts: {
        w: [
          { toolCalls: [{ name: "write", arguments: { path: "guest.txt", content: "x" } }] },
          { text: "." },
        ],
      },
    });
    for (const target of [
      { kind: "managed", ref: "m", root: dir },
      { kind: "local", targetId: "laptop" },
    ]) {
      const scope = parseDelegatedExecutionScope(
        captureDelegatedExecutionScope({ accountId: "acct", target, workDir: dir }),
      );
      const { host, log } = recordingHost();
      await runner.runTurn(request({ model: "scripted:w", scope }), host);
      expect(log).not.toContain("intent:write");
      expect(existsSync(join(dir, "guest.txt"))).toBe(false);
    }
  });
});
