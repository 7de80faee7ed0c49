import { mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PgDelegationRepository, type TranscriptMessage } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { afterAll, describe, expect, it } from "vitest";
import { composeWorkerPrompt, createAgentTurnRunner, type ScriptStep } from "../../src/agent/index.js";
import { DelegationService, FileSpillStore } from "../../src/delegation/index.js";

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
      const account = await repo.createAccount({ name: "loop-acct" });
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
});
