import { randomUUID } from "node:crypto";
import { createScriptedTurnRunner, DelegationService, FileSpillStore } from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import {
  delegationNodeTurns,
  hostAccessors,
  JournalNodeDispatcher,
  parseWorkflowDefinition,
  WorkflowEngine,
} from "../src/index.js";
import { until } from "./helpers.js";

const db = useTestDatabase();

describe("nodes through the delegation core", () => {
  it("nodes run through DelegationService's child-turn bracket; the one summary is delivered and acknowledged in the parent's journal (S004-416 S004-148 S004-068)", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const service = new DelegationService({
      repo,
      runner: createScriptedTurnRunner(),
      spill: new FileSpillStore(scratchDir("crw-spill-")),
    });
    await service.start();
    const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
    const parent = await repo.createRootSession(account.id, "scripted");
    const completions: string[] = [];
    let engineCompletions = 0;
    const engine = new WorkflowEngine({
      pool: db.pool,
      owner: `wf-${randomUUID()}`,
      dispatcher: new JournalNodeDispatcher(repo, delegationNodeTurns(service)),
      defaultModel: "scripted",
      repo,
      // The engine's own path (boot recovery's) is not this call's: the origin bound its emitter.
      onCompletion: async () => {
        engineCompletions++;
      },
    });
    try {
      await engine.open();
      const def = parseWorkflowDefinition(`
name: through-core
nodes:
  - { id: left, task: "inspect the left side" }
  - { id: right, task: "inspect the right side" }
  - { id: join, task: "join both", dependsOn: [left, right] }
`);
      const started = await engine.start(
        {
          parentSessionId: parent.id,
          principalAccountId: account.id,
          toolCallId: "call-1",
          currentAccess: async () => service.authorityFor(parent),
          currentWorkDir: async () => null,
          // The delegationCompletionEmitter, as the daemon binds it: the summary is in the inbox; the
          // delegation core delivers it. Marked done only once the core has taken it.
          ...hostAccessors({
            completion: async (c) => {
              await service.resultQueued(c.parentSessionId, c.principalAccountId, c.resultId);
              await new Promise((r) => setTimeout(r, 20));
              completions.push(c.resultId);
            },
          }),
        },
        { definition: def },
      );
      const outcome = await engine.finished(started.workflowId);
      // The emitter's outcome was awaited before the workflow counted as finished.
      expect(completions).toEqual([outcome.resultId]);
      expect(engineCompletions).toBe(0);
      expect(outcome.status).toBe("completed");
      expect(outcome.summary).toContain("answer: inspect the left side");
      await until(
        async () => (await repo.settledResultIds(parent.id, account.id)).includes(outcome.resultId as string),
        "summary delivered",
      );
      await service.whenIdle();
      expect(completions).toEqual([outcome.resultId]);
      // Delivered exactly once, acknowledged in the same transaction as the parent's journal entry.
      expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([]);
      const acks = await db.pool.query(
        "select count(*)::int n from delegation_result_acks where result_id = $1::uuid",
        [outcome.resultId],
      );
      expect(acks.rows[0].n).toBe(1);
      const entries = await repo.readJournal(parent.id, account.id);
      const carrying = entries.filter(
        (e) =>
          e.body.type === "message" &&
          "details" in e.body.message &&
          e.body.message.details?.resultId === outcome.resultId,
      );
      expect(carrying).toHaveLength(1);
      // The parent's one completion is the whole-workflow summary, never a result per node; node progress
      // never enters the inbox or the parent's journal.
      const inbox = await db.pool.query<{ id: string; kind: string }>(
        "select id, kind from delegation_results where parent_session_id = $1::uuid",
        [parent.id],
      );
      expect(inbox.rows).toEqual([{ id: outcome.resultId, kind: "workflow_summary" }]);
      const customs = entries.filter((e) => e.body.type === "message" && e.body.message.role === "custom");
      expect(customs).toHaveLength(1);
      const summary = carrying[0]?.body;
      expect(
        summary?.type === "message" && summary.message.role === "custom" && summary.message.content,
      ).toMatch(/^\[workflow summary for call call-1: ok\]\n/);
      // Node children are ordinary delegated sessions with the worker's journal, but no run rows.
      const runs = await db.pool.query(
        "select count(*)::int n from subagent_runs where parent_session_id = $1::uuid",
        [parent.id],
      );
      expect(runs.rows[0].n).toBe(0);
    } finally {
      await engine.close();
      await service.close();
    }
  });
});
