import { PgDelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { createAgentTurnRunner, DelegationService, FileSpillStore } from "../../src/index.js";
import { startFakeModelServer } from "../agent/fake-model-server.js";
import { scratchDir } from "./helpers.js";

const db = useTestDatabase();

const systemOf = (body: Record<string, unknown>): string => {
  const messages = body.messages as Array<{ role: string; content: unknown }>;
  const system = messages.find((m) => m.role === "system" || m.role === "developer");
  return typeof system?.content === "string" ? system.content : JSON.stringify(system?.content);
};

describe("worker prompt composition on the real wire", () => {
  it("composing a fresh worker's prompt adds no provider request, and later turns reuse the stored bytes (S004-020 S004-019)", async () => {
    // Parent asks for a foreground child; the child answers; the parent answers; then one continuation.
    const server = await startFakeModelServer([
      { tool: { id: "call_p1", name: "Delegate", arguments: { task: "say hi", background: false } } },
      { text: "hi from the child" },
      { text: "parent done" },
      { text: "second answer from the child" },
      // The continuation was asked outside a turn of the parent: its result reaches the parent's inbox,
      // which the parent answers with a turn of its own.
      { text: "parent noted the second answer" },
    ]);
    try {
      const repo = new PgDelegationRepository(db.pool);
      const service = new DelegationService({
        repo,
        runner: createAgentTurnRunner({
          models: () => ({
            api: "openai-completions",
            modelId: "fake-model-1",
            baseUrl: `${server.url}/v1`,
            apiKey: "test-key",
          }),
        }),
        spill: new FileSpillStore(scratchDir("crw-compose-")),
      });
      const account = await repo.createAccount({ name: `compose-${crypto.randomUUID()}` });
      const parent = await service.createRootSession(account.id, "openai-completions:fake-model-1");
      const outcome = await service.prompt(parent.id, account.id, "delegate a greeting");
      expect(outcome.stopReason).toBe("stop");
      await service.whenIdle();
      // Exactly the turns' own requests: parent, child, parent. Composition itself asked the provider nothing.
      expect(server.requests).toHaveLength(3);
      const run = await repo.runForToolCall(parent.id, "call_p1", account.id);
      if (!run?.childSessionId) throw new Error("expected the child's run");
      const child = await repo.getSession(run.childSessionId, account.id);
      const storedParent = await repo.getSession(parent.id, account.id);
      expect(child.systemPrompt).toContain("# Worker contract");
      expect(storedParent.systemPrompt).not.toContain("# Worker contract");
      // What went on the wire is the stored composition, byte for byte.
      const [p1, c1, p2] = server.requests.map((r) => systemOf(r.body));
      expect(c1).toBe(child.systemPrompt);
      expect(p1).toBe(storedParent.systemPrompt);
      expect(p2).toBe(p1);
      const again = await service.continueSubagent({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        childSessionId: child.id,
        toolCallId: "call_c2",
        text: "once more",
        mode: "foreground",
      });
      expect(again).toMatchObject({ kind: "result", body: "second answer from the child" });
      await service.whenIdle();
      // The continuation's turn, then the parent's turn on its result: still no request of composition's own.
      expect(server.requests).toHaveLength(5);
      expect(systemOf(server.requests[3]?.body ?? {})).toBe(child.systemPrompt);
      expect(systemOf(server.requests[4]?.body ?? {})).toBe(storedParent.systemPrompt);
      await service.close();
    } finally {
      await server.close();
    }
  });
});
