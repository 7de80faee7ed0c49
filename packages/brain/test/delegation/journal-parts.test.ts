import { assistantMessageSchema } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { createAgentTurnRunner, modelConfigFor, recoverDelegations } from "../../src/index.js";
import { startFakeModelServer } from "../agent/fake-model-server.js";
import { gateTool, latch, makeService, newParent, waitFor } from "./helpers.js";

const db = useTestDatabase();

describe("the journal keeps every content part the agent loop produces", () => {
  it("a thinking block and its signature are journaled and replayed byte for byte after a restart", async () => {
    const thinking = { thinking: "Weigh it first.\n  Then act, carefully. ", signature: "c2lnbmF0dXJl+/==" };
    const server = await startFakeModelServer([
      { tool: { id: "toolu_01", name: "Gate", arguments: { key: "g" } }, thinking },
      { text: "finished after the restart" },
    ]);
    try {
      const runner = createAgentTurnRunner({
        // The root parent stays on the offline scripted model; the child talks to the loopback server.
        models: (name) =>
          name === "scripted"
            ? modelConfigFor(name)
            : {
                api: "anthropic-messages",
                modelId: "claude-fake-1",
                baseUrl: server.url,
                apiKey: "test-key",
              },
      });
      const gate = latch();
      const gates = new Map([["g", gate.promise]]);
      const first = makeService(db.pool, { runner, tools: () => [gateTool("Gate", gates)] });
      await first.service.start();
      const { account, parent } = await newParent(first.service);
      const receipt = await first.service.delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: "think",
        task: "think, then use the gate",
        mode: "background",
        model: "anthropic-messages:claude-fake-1",
      });
      if (receipt.kind !== "started") throw new Error("expected a background call");
      const child = receipt.childSessionId;
      await waitFor(
        async () =>
          (await first.repo.readJournal(child, account.id)).some((e) => e.body.type === "tool_intent"),
        "the tool intent",
      );
      // The process stops with the tool still running: the checkpoint does not wait for it.
      await first.service.pauseForRestart();
      gate.open();
      await first.service.close();
      expect(server.requests).toHaveLength(1);

      // The journaled assistant message holds every part, in order, with the API that produced it.
      const journaled = (await first.repo.readJournal(child, account.id)).flatMap((e) =>
        e.body.type === "message" && e.body.message.role === "assistant" ? [e.body.message] : [],
      );
      expect(journaled).toHaveLength(1);
      expect(journaled[0]).toMatchObject({
        api: "anthropic-messages",
        providerContent: [
          { type: "thinking", thinking: thinking.thinking, thinkingSignature: thinking.signature },
          { type: "toolCall", id: "toolu_01", name: "Gate", arguments: { key: "g" } },
        ],
        content: [{ type: "toolCall", id: "toolu_01", name: "Gate", arguments: { key: "g" } }],
      });

      // Boot recovery in a new process continues the call; the provider gets the same parts back.
      const second = makeService(db.pool, { runner, tools: () => [gateTool("Gate", new Map())] });
      const report = await recoverDelegations(second.service).finally(() => second.service.whenIdle());
      await second.service.close();
      expect(report.continued).toEqual([receipt.runId]);
      expect(server.requests).toHaveLength(2);
      const wire = (server.requests[1]?.body.messages ?? []) as Array<{ role: string; content: unknown }>;
      const replayed = wire.find((m) => m.role === "assistant");
      expect(replayed?.content).toEqual([
        { type: "thinking", thinking: thinking.thinking, signature: thinking.signature },
        { type: "tool_use", id: "toolu_01", name: "Gate", input: { key: "g" } },
      ]);
      // Byte for byte: the thinking text and signature on the wire are exactly what the provider sent.
      const block = ((replayed?.content ?? []) as Array<Record<string, unknown>>)[0];
      expect(Buffer.from(String(block?.thinking)).equals(Buffer.from(thinking.thinking))).toBe(true);
      expect(block?.signature).toBe(thinking.signature);
      const run = await second.repo.getRun(receipt.runId, account.id);
      expect(run.status).toBe("succeeded");
    } finally {
      await server.close();
    }
  });

  it("a provider view that disagrees with the journal's content is refused", () => {
    const bad = assistantMessageSchema.safeParse({
      role: "assistant",
      content: [{ type: "text", text: "a" }],
      stopReason: "stop",
      providerContent: [{ type: "text", text: "b" }],
    });
    expect(bad.success).toBe(false);
    const good = assistantMessageSchema.safeParse({
      role: "assistant",
      content: [{ type: "text", text: "a" }],
      stopReason: "stop",
      providerContent: [
        { type: "thinking", thinking: "t" },
        { type: "text", text: "a", textSignature: "s" },
      ],
    });
    expect(good.success).toBe(true);
  });
});
