import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import {
  captureDelegatedExecutionScope,
  createScriptedTurnRunner,
  parseDelegatedExecutionScope,
  type TurnHost,
  type TurnRequest,
} from "@crw/brain";
import { SubagentSessionDispatch } from "@crw/subagent";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";

closePoolsAfterEach();

/** OpenAI Chat Completions over SSE on loopback: one text answer with fixed usage figures. */
const server = createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    const chunk = (delta: object, finish: string | null, usage?: object) =>
      `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", created: 0, model: "m", choices: [{ index: 0, delta, finish_reason: finish }], ...(usage && { usage }) })}\n\n`;
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.end(
      chunk({ role: "assistant", content: "measured" }, null) +
        chunk({}, "stop", { prompt_tokens: 13, completion_tokens: 5, total_tokens: 18 }) +
        "data: [DONE]\n\n",
    );
  });
});
let baseUrl = "";
beforeAll(async () => {
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

const host: TurnHost = {
  record: async () => {},
  beforeToolCall: async () => {},
  drainSteering: async () => [],
  progress: () => {},
};

function request(model: string): TurnRequest {
  return {
    sessionId: randomUUID(),
    principalAccountId: "acct-1",
    model,
    systemPrompt: "You are a worker.",
    context: [{ role: "user", content: "measure this" }],
    tools: [],
    scope: parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({ accountId: "acct-1", target: { kind: "host", ref: null } }),
    ),
    readOnly: false,
    workDir: null,
    signal: new AbortController().signal,
  };
}

describe("provider usage across the runner boundary", () => {
  it("each provider response of a runner's agent-loop turn reaches attachProviderUsageSink with its session and turn", async () => {
    const { pool, events } = makePool({
      agentOptions: () => ({
        baseUrls: { "openai-completions": baseUrl },
        apiKeyEnv: { "openai-completions": "CRW_USAGE_KEY" },
      }),
      env: { CRW_USAGE_KEY: "k" },
    });
    const reports: Parameters<Parameters<typeof pool.attachProviderUsageSink>[0]>[0][] = [];
    pool.attachProviderUsageSink((r) => reports.push(r));
    const dispatch = new SubagentSessionDispatch({
      pool,
      inProcess: createScriptedTurnRunner(),
      runnerKind: "agent",
    });
    const req = request("openai-completions:m");
    expect(await dispatch.runTurn(req, host)).toEqual({ stopReason: "stop" });
    expect(reports).toEqual([
      {
        runnerId: pool.routeOf(req.sessionId),
        sessionId: req.sessionId,
        turnId: expect.any(String),
        usage: {
          api: "openai-completions",
          provider: "openai",
          model: "m",
          stopReason: "stop",
          input: 13,
          output: 5,
          cacheRead: 0,
          cacheWrite: 0,
          totalTokens: 18,
          cost: expect.any(Number),
        },
      },
    ]);
    // The offline scripted provider is not a provider response: nothing is reported.
    expect(await dispatch.runTurn(request("scripted"), host)).toEqual({ stopReason: "stop" });
    expect(reports).toHaveLength(1);
    // A sink that throws is reported by name; the turn is not failed by it.
    pool.attachProviderUsageSink(() => {
      throw new Error("usage table unavailable");
    });
    expect(await dispatch.runTurn(request("openai-completions:m"), host)).toEqual({ stopReason: "stop" });
    expect(events.filter((e) => e.type === "sink_failed")).toEqual([
      { type: "sink_failed", sink: "providerUsage", error: "usage table unavailable" },
    ]);
  });
});
