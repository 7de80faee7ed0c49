import { mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PgDelegationRepository, type TranscriptMessage } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { afterAll, describe, expect, it } from "vitest";
import { composeWorkerPrompt, createAgentTurnRunner, type ScriptStep } from "../../src/agent/index.js";
import { DelegationService, FileSpillStore, type MutatingTool } from "../../src/delegation/index.js";

const db = useTestDatabase();
const root = realpathSync(mkdtempSync(join(tmpdir(), "crw-loop-")));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const steps = (s: ScriptStep[]) => JSON.stringify({ steps: s });

describe("the real agent loop behind the delegation core, on PostgreSQL", () => {
  it("a parent delegates to a child that writes a file with its own tools; every step is journaled in order", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const prompts: string[] = [];
    const service = new DelegationService({
      repo,
      runner: createAgentTurnRunner(),
      spill: new FileSpillStore(join(root, "spill")),
      systemPrompt: (_session, scope) => {
        const prompt = scope
          ? composeWorkerPrompt({
              model: { id: "scripted" },
              tools: [],
              role: scope.role,
              context: scope.context,
            })
          : "root";
        prompts.push(prompt);
        return prompt;
      },
    });
    await service.start();
    try {
      const account = await repo.createAccount({ name: "loop-acct", isOwner: true });
      const parent = await service.createRootSession(account.id, "scripted");
      const workDir = join(root, "child-work");
      mkdirSync(workDir);
      const childTask = steps([
        { toolCalls: [{ name: "write", arguments: { path: "out.txt", content: "made by the child" } }] },
        { text: "child wrote out.txt" },
      ]);
      const outcome = await service.prompt(
        parent.id,
        account.id,
        steps([
          {
            toolCalls: [
              {
                name: "Delegate",
                arguments: { task: childTask, cwd: workDir, role: "writer", background: false },
              },
            ],
          },
          { text: "parent done" },
        ]),
      );
      expect(outcome).toEqual({ stopReason: "stop" });
      await service.whenIdle();

      expect(readFileSync(join(workDir, "out.txt"), "utf8")).toBe("made by the child");
      const parentJournal = await repo.readJournal(parent.id, account.id);
      const parentMessages = parentJournal.flatMap((e) =>
        e.body.type === "message" ? [e.body.message] : [],
      );
      const delegateResult = parentMessages.find(
        (m): m is Extract<TranscriptMessage, { role: "toolResult" }> => m.role === "toolResult",
      );
      expect(delegateResult).toMatchObject({
        toolName: "Delegate",
        content: "child wrote out.txt",
        isError: false,
      });
      expect(delegateResult?.details?.resultId).toBeTruthy();
      expect(await repo.settledResultIds(parent.id, account.id)).toEqual([delegateResult?.details?.resultId]);
      expect(parentMessages.at(-1)).toMatchObject({
        role: "assistant",
        content: [{ type: "text", text: "parent done" }],
      });

      // The child's journal: task, reply, the write's intent before its result, then the answer.
      const childId = delegateResult?.details?.childSessionId as string;
      const childJournal = await repo.readJournal(childId, account.id);
      expect(
        childJournal.map((e) => (e.body.type === "message" ? e.body.message.role : e.body.type)),
      ).toEqual(["user", "assistant", "tool_intent", "toolResult", "assistant"]);
      // The child ran as a fresh worker with its role from the durable scope.
      expect(prompts.some((p) => p.includes("# Worker contract") && p.includes("# Role: writer"))).toBe(true);
    } finally {
      await service.close();
    }
  });

  it("a streaming parent on the real loop takes background results after its tool round, FIFO, before its next request", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const queuedOrder = async (parentId: string) =>
      (
        await db.pool.query<{ id: string }>(
          "select id from delegation_results where parent_session_id = $1 order by queue_seq",
          [parentId],
        )
      ).rows.map((r) => r.id);
    let parentId = "";
    // Holds the parent inside a tool round until both children's results are queued (bounded).
    const gate: MutatingTool = {
      name: "Gate",
      description: "waits until both results are queued",
      parameters: { type: "object", properties: {} },
      async execute() {
        const deadline = Date.now() + 20_000;
        while ((await queuedOrder(parentId)).length < 2 && Date.now() < deadline)
          await new Promise((r) => setTimeout(r, 20));
        return { content: "both queued" };
      },
    };
    const service = new DelegationService({
      repo,
      runner: createAgentTurnRunner(),
      spill: new FileSpillStore(join(root, "spill-2")),
      tools: (session) => (session.kind === "root" ? [gate] : []),
    });
    await service.start();
    try {
      const account = await repo.createAccount({ name: "loop-acct-2", isOwner: true });
      const parent = await service.createRootSession(account.id, "scripted");
      parentId = parent.id;
      const child = (answer: string) => ({
        name: "Delegate",
        arguments: { task: steps([{ text: answer }]), background: true },
      });
      const outcome = await service.prompt(
        parent.id,
        account.id,
        steps([
          { toolCalls: [child("from A"), child("from B")] },
          { toolCalls: [{ name: "Gate", arguments: {} }] },
          { text: "saw {{last}}" },
        ]),
      );
      expect(outcome).toEqual({ stopReason: "stop" });
      await service.whenIdle();
      const journal = await repo.readJournal(parent.id, account.id);
      const msgs = journal.flatMap((e) => (e.body.type === "message" ? [e.body.message] : []));
      // Each result joined at a tool-round boundary (right after a tool result or another result) ...
      for (const [i, m] of msgs.entries()) {
        if (m.role === "custom") expect(["toolResult", "custom"]).toContain(msgs[i - 1]?.role);
      }
      expect(msgs.filter((m) => m.role === "custom")).toHaveLength(2);
      // ... and before the next provider request: the answer comes after both, in the same turn.
      expect(msgs.at(-1)?.role).toBe("assistant");
      expect(msgs.findLastIndex((m) => m.role === "custom")).toBeLessThan(msgs.length - 1);
      expect(msgs.filter((m) => m.role === "user")).toHaveLength(1);
      const delivered = msgs.flatMap((m) =>
        m.role === "custom" && m.details?.resultId ? [m.details.resultId] : [],
      );
      expect(delivered).toEqual(await queuedOrder(parent.id));
      expect(await repo.settledResultIds(parent.id, account.id)).toHaveLength(2);
      // The next request saw both results: the last input it answered is the second delivered result.
      const last = msgs.at(-1);
      expect(
        last?.role === "assistant" && last.content[0]?.type === "text" ? last.content[0].text : "",
      ).toMatch(/^saw /);
    } finally {
      await service.close();
    }
  });
});
