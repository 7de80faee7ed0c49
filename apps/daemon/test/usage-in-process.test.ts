import { createHash, randomBytes } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Daemon, IN_PROCESS_RUNNER_ID } from "../src/index.js";
import { TestClient } from "./support/client.js";
import { startTestDaemon } from "./support/daemon.js";
import { ownerHealth } from "./support/health.js";
import { type LoopbackProvider, lastUserText, startLoopbackProvider } from "./support/provider.js";
import { waitFor } from "./support/wait.js";

/**
 * Provider usage of the daemon's own turns (runner pool off: every turn runs in the daemon's process) and
 * the fork-prefix diagnostics API, against a model provider on loopback (OpenAI Chat Completions over SSE)
 * that reports usage, cached prompt tokens included.
 */
const db = useTestDatabase();
const KEY_VAR = "CRW_TEST_USAGE_KEY";
const MODEL = "openai-completions:usage-m";
let provider: LoopbackProvider;
let daemon: Daemon;
let owner: TestClient;
let other: TestClient;

const usage = (prompt: number, completion: number, cached = 0) => ({
  prompt_tokens: prompt,
  completion_tokens: completion,
  total_tokens: prompt + completion,
  prompt_tokens_details: { cached_tokens: cached },
});

beforeAll(async () => {
  provider = await startLoopbackProvider((request) => {
    const text = lastUserText(request);
    const toolRound = (request.body.messages ?? []).some((m) => m.role === "tool");
    // A parent whose request (cached 60 of 100 prompt tokens) asks for a fork of itself.
    const fork = /FORK-PARENT-(\w+)/.exec(text);
    if (fork && !toolRound)
      return {
        tool: {
          id: `call-fork-${fork[1]}`,
          name: "Delegate",
          arguments: { task: `FORK-TASK-${fork[1]}`, fork: true, background: false },
        },
        usage: usage(100, 5, 60),
      };
    if (fork) return { text: "parent done", usage: usage(120, 3, 100) };
    // The fork's own response: HIT reads more than the parent cached, MISS less.
    if (text.includes("FORK-TASK-HIT")) return { text: "fork hit", usage: usage(110, 4, 90) };
    if (text.includes("FORK-TASK-MISS")) return { text: "fork miss", usage: usage(110, 4, 10) };
    // A response whose provider counted nothing (no usage-bearing figures).
    if (text.includes("ZERO")) return { text: "uncounted", usage: usage(0, 0) };
    return { text: `answered: ${text.slice(-40)}`, usage: usage(50, 4, 20) };
  });
  const dataDir = scratchDir("crw-daemon-usage-");
  ({ daemon, owner } = await startTestDaemon({
    databaseUrl: db.url,
    dataDir,
    baseUrls: { "openai-completions": provider.baseUrl },
    keyVar: KEY_VAR,
    overrides: { runtime: { subagentRunnerEnabled: false }, models: { default: MODEL } },
  }));
  const account = await daemon.runtime.repo.createAccount({ name: "usage-other" });
  const token = `crw_${randomBytes(18).toString("base64url")}`;
  await daemon.runtime.repo.addApiToken(account.id, createHash("sha256").update(token).digest(), "test");
  other = await TestClient.connect(daemon.state.url, token);
});

afterAll(async () => {
  owner?.close();
  other?.close();
  await daemon?.stop();
  await provider?.close();
});

const health = async () =>
  (await ownerHealth(daemon.state.url, daemon.config.dataDir)) as {
    providerUsage: {
      responses: number;
      input: number;
      output: number;
      totalTokens: number;
      unrecorded: number;
    };
  };

const usageRows = async (sessionId: string) =>
  (
    await db.pool.query(
      `select runner_id, turn_id, model, stop_reason, input_tokens::int as input, output_tokens::int as output,
              cache_read_tokens::int as cache_read, total_tokens::int as total
         from provider_usage where session_id = $1 order by id`,
      [sessionId],
    )
  ).rows;

describe("provider usage of the daemon's own turns", () => {
  it("with runners off, a root session's and its child's provider responses are recorded, counted in /health and published like runner turns", async () => {
    const before = (await health()).providerUsage;
    const published: { type: string; runnerId: string; sessionId: string }[] = [];
    const bus = daemon.runtime.bus;
    const original = bus.publish.bind(bus);
    bus.publish = (topic: string, event: unknown) => {
      if ((event as { type?: string }).type === "provider_usage")
        published.push(event as { type: string; runnerId: string; sessionId: string });
      original(topic, event);
    };
    let childSessionId = "";
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
    try {
      const reply = await owner.ok<{ stopReason: string; reply: string }>("session.send", {
        sessionId,
        text: "root question",
      });
      expect(reply).toMatchObject({ stopReason: "stop", reply: "answered: root question" });
      ({ childSessionId } = await owner.ok<{ childSessionId: string }>("session.delegate", {
        sessionId,
        task: "child question",
      }));
      // The child's result reaches the idle root as a delivered result, which gets its one follow-up turn: a
      // third response, on the root session.
      await waitFor(
        async () =>
          published.length === 3 &&
          (await usageRows(sessionId)).length === 2 &&
          (await usageRows(childSessionId)).length === 1,
        "the usage rows and events",
      );
    } finally {
      bus.publish = original;
    }
    // 50 prompt tokens of which 20 cached: 30 uncached input, 20 read from the cache.
    const row = {
      runner_id: IN_PROCESS_RUNNER_ID,
      turn_id: expect.any(String),
      model: "usage-m",
      stop_reason: "stop",
      input: 30,
      output: 4,
      cache_read: 20,
      total: 54,
    };
    expect(await usageRows(sessionId)).toEqual([row, row]);
    expect(await usageRows(childSessionId)).toEqual([row]);
    // Both turns ran in the daemon (runners off) and each response was counted once.
    expect(daemon.runtime.placements.runner).toBe(0);
    const after = (await health()).providerUsage;
    expect(after.responses - before.responses).toBe(3);
    expect(after.input - before.input).toBe(90);
    expect(after.output - before.output).toBe(12);
    expect(after.totalTokens - before.totalTokens).toBe(162);
    expect(after.unrecorded).toBe(0);
    expect(published).toEqual([
      expect.objectContaining({ type: "provider_usage", runnerId: IN_PROCESS_RUNNER_ID, sessionId }),
      expect.objectContaining({
        type: "provider_usage",
        runnerId: IN_PROCESS_RUNNER_ID,
        sessionId: childSessionId,
      }),
      expect.objectContaining({ type: "provider_usage", runnerId: IN_PROCESS_RUNNER_ID, sessionId }),
    ]);
    // The journal's assistant rows carry the same responses' usage.
    const { rows } = await db.pool.query(
      "select provider_usage as usage from journal_entries where session_id = $1 and role = 'assistant' order by seq",
      [sessionId],
    );
    expect(rows).toEqual([
      { usage: expect.objectContaining({ input: 30, cacheRead: 20, totalTokens: 54 }) },
      { usage: expect.objectContaining({ input: 30, cacheRead: 20, totalTokens: 54 }) },
    ]);
  });
});

describe("session.forkPrefix", () => {
  it("a root session's diagnostics page past responses without figures to the newest usage-bearing one; not a fork (S004-182)", async () => {
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
    await owner.ok("session.send", { sessionId, text: "first question" });
    await owner.ok("session.send", { sessionId, text: "ZERO second question" });
    const diag = await owner.ok<Record<string, unknown>>("session.forkPrefix", { sessionId });
    expect(diag).toMatchObject({
      sessionId,
      parentSessionId: null,
      fork: false,
      inheritedThrough: null,
      // The first answer (seq 2), not the newer uncounted one (seq 4).
      response: {
        sessionId,
        seq: 2,
        promptTokens: 50,
        cacheReadRatio: 0.4,
        usage: { input: 30, cacheRead: 20, output: 4 },
      },
      parentResponse: null,
      parentCachedTokens: null,
      prefixFromCache: null,
    });
  });

  it("a fork's diagnostics compare its response with the parent's request whose prompt was the inherited prefix", async () => {
    for (const [name, expected] of [
      ["HIT", true],
      ["MISS", false],
    ] as const) {
      const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
      const reply = await owner.ok<{ reply: string }>("session.send", {
        sessionId,
        text: `FORK-PARENT-${name}`,
      });
      expect(reply.reply).toBe("parent done");
      const { rows } = await db.pool.query<{ id: string }>(
        "select id::text from sessions where parent_session_id = $1",
        [sessionId],
      );
      expect(rows).toHaveLength(1);
      const fork = rows[0]?.id ?? "";
      const diag = await owner.ok<Record<string, unknown>>("session.forkPrefix", { sessionId: fork });
      expect(diag, name).toMatchObject({
        sessionId: fork,
        parentSessionId: sessionId,
        fork: true,
        inheritedThrough: expect.any(Number),
        response: { sessionId: fork, promptTokens: 110, usage: { cacheRead: name === "HIT" ? 90 : 10 } },
        // The parent's response asking for the fork: 60 of its 100 prompt tokens came from the cache.
        parentResponse: { sessionId, promptTokens: 100, usage: { cacheRead: 60 } },
        parentCachedTokens: 60,
        prefixFromCache: expected,
      });
    }
  });

  it("another account's session is not found, and a bad id is refused before any read", async () => {
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
    const frame = await other.call("session.forkPrefix", { sessionId });
    expect(frame.error).toMatchObject({ data: { code: "not_found" } });
    const bad = await owner.call("session.forkPrefix", { sessionId: "not-a-uuid" });
    expect(bad.error).toMatchObject({ data: { code: "invalid_params" } });
  });
});
