import { mkdtempSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { composeWorkerPrompt, forkPrefix, type ModelConfig, runChildTurn } from "../../src/agent/index.js";
import { captureDelegatedExecutionScope } from "../../src/scope/index.js";
import { type FakeReply, startFakeModelServer } from "./fake-model-server.js";

const dir = realpathSync(mkdtempSync(join(tmpdir(), "crw-providers-")));
writeFileSync(join(dir, "a.txt"), "contents of a");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const script = (): FakeReply[] => [
  { tool: { id: "call_1", name: "read", arguments: { path: "a.txt" } } },
  { text: "the file says hi" },
];

// A Codex access token is a JWT naming the ChatGPT account; the server here does not check its signature.
const codexToken = [
  Buffer.from(JSON.stringify({ alg: "none", typ: "JWT" })).toString("base64url"),
  Buffer.from(
    JSON.stringify({ "https://api.openai.com/auth": { chatgpt_account_id: "acct-test" } }),
  ).toString("base64url"),
  "sig",
].join(".");

const families: {
  api: "openai-completions" | "openai-responses" | "anthropic-messages" | "openai-codex-responses";
  base: (url: string) => string;
  path: string;
}[] = [
  { api: "openai-codex-responses", base: (u) => u, path: "/codex/responses" },
  { api: "openai-completions", base: (u) => `${u}/v1`, path: "/v1/chat/completions" },
  { api: "openai-responses", base: (u) => `${u}/v1`, path: "/v1/responses" },
  { api: "anthropic-messages", base: (u) => u, path: "/v1/messages" },
];

describe("providers configured by model id and base URL, over the real wire protocols", () => {
  for (const family of families) {
    it(`${family.api}: runs a tool round and a final answer against a compatible server`, async () => {
      const server = await startFakeModelServer(script());
      try {
        const model: ModelConfig = {
          api: family.api,
          modelId: "fake-model-1",
          baseUrl: family.base(server.url),
          apiKey: family.api === "openai-codex-responses" ? codexToken : "test-key",
        };
        const out = await runChildTurn({
          sessionId: "s-1",
          systemPrompt: "SYSTEM-PROMPT-MARKER",
          messages: [],
          input: "read a.txt",
          scope: captureDelegatedExecutionScope({
            accountId: "a",
            target: { kind: "host", ref: null },
            workDir: dir,
            tools: { allow: ["read"] },
          }),
          workDir: dir,
          model,
        });
        expect(out.stopReason).toBe("stop");
        expect(out.finalText).toBe("the file says hi");
        expect(out.toolCalls).toHaveLength(1);
        expect(out.toolCalls[0]?.result).toBe("contents of a");
        expect(server.requests.map((r) => r.path)).toEqual([family.path, family.path]);
        const first = JSON.stringify(server.requests[0]?.body);
        expect(first).toContain("SYSTEM-PROMPT-MARKER");
        expect(first).toContain("fake-model-1");
        // Only the allowed tool is declared to the model.
        expect(first).toContain('"read"');
        expect(first).not.toContain('"shell"');
        // The second request carries the tool result back.
        expect(JSON.stringify(server.requests[1]?.body)).toContain("contents of a");
        expect(out.usage.providerCalls).toBe(2);
        if (family.api === "openai-codex-responses")
          expect(server.requests[0]?.headers["chatgpt-account-id"]).toBe("acct-test");
        expect(out.usage.output).toBeGreaterThan(0);
      } finally {
        await server.close();
      }
    });
  }

  it("a server error comes back as an error outcome", async () => {
    const server = await startFakeModelServer([{ status: 400 }]);
    try {
      const out = await runChildTurn({
        sessionId: "s-2",
        systemPrompt: "x",
        messages: [],
        input: "hi",
        scope: captureDelegatedExecutionScope({
          accountId: "a",
          target: { kind: "host", ref: null },
          workDir: dir,
        }),
        workDir: dir,
        model: { api: "openai-completions", modelId: "m", baseUrl: `${server.url}/v1`, apiKey: "k" },
      });
      expect(out.stopReason).toBe("error");
      expect(out.errorMessage).toBeTruthy();
    } finally {
      await server.close();
    }
  });

  it("a missing API key is a typed configuration error naming where the key is looked up", async () => {
    await expect(
      runChildTurn({
        sessionId: "s",
        systemPrompt: "",
        messages: [],
        input: "x",
        scope: captureDelegatedExecutionScope({ accountId: "a", target: { kind: "host", ref: null } }),
        workDir: dir,
        model: {
          api: "openai-completions",
          modelId: "m",
          baseUrl: "http://127.0.0.1:9/v1",
          apiKeyEnv: "CRW_TEST_NO_SUCH_KEY",
        },
      }),
    ).rejects.toMatchObject({
      name: "AgentConfigError",
      code: "missing_api_key",
      message: expect.stringContaining("CRW_TEST_NO_SUCH_KEY"),
    });
  });

  it("rejects an unusable configuration with a typed error", async () => {
    await expect(
      runChildTurn({
        sessionId: "s",
        systemPrompt: "",
        messages: [],
        input: "x",
        scope: captureDelegatedExecutionScope({ accountId: "a", target: { kind: "host", ref: null } }),
        workDir: dir,
        model: { api: "anthropic-messages", modelId: "m", baseUrl: "not a url" },
      }),
    ).rejects.toMatchObject({ name: "AgentConfigError", code: "invalid_model_config" });
  });
});

describe("fork prefix on the wire", () => {
  it.each(["openai-completions", "openai-responses", "anthropic-messages"] as const)(
    "%s: a turn given its parent's system prompt and messages repeats the parent's request prefix byte for byte",
    async (api) => {
      const server = await startFakeModelServer([
        { tool: { id: "call_1", name: "read", arguments: { path: "a.txt" } } },
        { text: "parent answer" },
        { text: "fork answer" },
      ]);
      try {
        const model: ModelConfig = {
          api,
          modelId: "fake",
          baseUrl: api === "anthropic-messages" ? server.url : `${server.url}/v1`,
          apiKey: "k",
        };
        const scope = captureDelegatedExecutionScope({
          accountId: "a",
          target: { kind: "host", ref: null },
          workDir: dir,
        });
        const systemPrompt = composeWorkerPrompt({
          model: { id: "fake" },
          tools: [{ name: "read", description: "Read" }],
          role: "parent",
        });
        const parent = await runChildTurn({
          sessionId: "parent",
          systemPrompt,
          messages: [],
          input: "read a.txt",
          scope,
          workDir: dir,
          model,
        });
        const field = api === "openai-responses" ? "input" : "messages";
        const lastParentRequest = server.requests[1]?.body as Record<string, unknown[]>;
        const prefix = forkPrefix({
          systemPrompt,
          toolNames: ["read", "write", "edit", "shell"],
          messages: parent.messages,
        });
        await runChildTurn({
          sessionId: "fork",
          systemPrompt: prefix.systemPrompt,
          messages: prefix.messages,
          input: "fork task",
          scope,
          workDir: dir,
          model,
        });
        const forkRequest = server.requests[2]?.body as Record<string, unknown[]>;
        expect(JSON.stringify(forkRequest.tools)).toBe(JSON.stringify(lastParentRequest.tools));
        // Everything the parent sent is the fork's prefix; the parent's answer and the fork's task follow.
        expect(JSON.stringify(forkRequest.system ?? forkRequest.instructions ?? null)).toBe(
          JSON.stringify(lastParentRequest.system ?? lastParentRequest.instructions ?? null),
        );
        // Anthropic's cache breakpoint (`cache_control`) always sits on the newest block, so it moves as the
        // conversation grows; the cached bytes it marks are what must match.
        const withoutBreakpoints = (list: unknown[]) =>
          JSON.parse(JSON.stringify(list, (k, v) => (k === "cache_control" ? undefined : v))) as unknown[];
        const parentMessages = withoutBreakpoints(lastParentRequest[field] as unknown[]);
        const forkMessages = withoutBreakpoints(forkRequest[field] as unknown[]);
        const shared = parentMessages.length;
        expect(JSON.stringify(forkMessages.slice(0, shared))).toBe(JSON.stringify(parentMessages));
        expect(JSON.stringify(forkMessages.slice(shared))).toContain("fork task");
      } finally {
        await server.close();
      }
    },
  );
});
