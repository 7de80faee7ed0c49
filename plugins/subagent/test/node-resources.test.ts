import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { createAgentTurnRunner, DelegationService, FileSpillStore } from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import { MemoryRetryPolicySource, SubagentRunnerPool, SubagentSessionDispatch } from "@crw/subagent";
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

const db = useTestDatabase();
const KEY_ENV = "CRW_NODE_RESOURCES_KEY";

type Captured = { model: string; authorization: string | undefined; firstUser: string };

/** A provider on loopback speaking the Chat Completions streaming wire protocol: every request is captured. */
async function loopbackProvider() {
  const requests: Captured[] = [];
  const server = createServer((req, res) => {
    let raw = "";
    req.on("data", (d) => {
      raw += String(d);
    });
    req.on("end", () => {
      const body = JSON.parse(raw) as { model: string; messages: { role: string; content: unknown }[] };
      const user = body.messages.find((m) => m.role === "user");
      requests.push({
        model: body.model,
        authorization: req.headers.authorization,
        firstUser: typeof user?.content === "string" ? user.content : JSON.stringify(user?.content),
      });
      const chunk = (delta: object, finish: string | null, usage?: object) =>
        `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", created: 0, model: body.model, choices: [{ index: 0, delta, finish_reason: finish }], ...(usage && { usage }) })}\n\n`;
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(
        chunk({ role: "assistant", content: `answered by ${body.model}` }, null) +
          chunk({}, "stop", { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 }) +
          "data: [DONE]\n\n",
      );
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  return {
    baseUrl: `http://127.0.0.1:${port}/v1`,
    requests,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

describe("workflow work uses the selected model and the ordinary runner resources", () => {
  it("node turns go to the workflow's selected models with the account's provider credentials, through the same runner pool as an ordinary delegation (S004-342)", async () => {
    process.env[KEY_ENV] = "account-key";
    const provider = await loopbackProvider();
    const catalog = {
      baseUrls: { "openai-completions": provider.baseUrl },
      apiKeyEnv: { "openai-completions": KEY_ENV },
    } as const;
    const repo = new PgDelegationRepository(db.pool);
    const placements: Array<{ sessionId: string; placement: string }> = [];
    const pool = new SubagentRunnerPool({
      sizing: () => ({ maxRunners: 1, turnsPerRunner: 4 }),
      retryPolicySource: () =>
        new MemoryRetryPolicySource({ revision: 1, maxRetries: 1, initialDelayMs: 100, multiplier: 2 }),
      catalog: () => ({ revision: 1, public: [], accounts: {} }),
      agentOptions: () => catalog,
    });
    const service = new DelegationService({
      repo,
      runner: new SubagentSessionDispatch({
        pool,
        inProcess: createAgentTurnRunner(catalog),
        runnerKind: "agent",
        onPlaced: (request, placement) => placements.push({ sessionId: request.sessionId, placement }),
        placementOf: async (request) => {
          const row = await repo.getSession(request.sessionId, request.principalAccountId);
          return row.parentSessionId
            ? { channelId: row.parentSessionId, parentSessionId: row.parentSessionId }
            : { channelId: row.id };
        },
      }),
      spill: new FileSpillStore(scratchDir("crw-spill-")),
    });
    await service.start();
    const engine = new WorkflowEngine({
      pool: db.pool,
      owner: `wf-${randomUUID()}`,
      dispatcher: new JournalNodeDispatcher(repo, delegationNodeTurns(service)),
      defaultModel: "openai-completions:workflow-default",
      repo,
      onCompletion: (c) => service.resultQueued(c.parentSessionId, c.principalAccountId, c.resultId),
    });
    try {
      await engine.open();
      const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
      const parent = await repo.createRootSession(account.id, "openai-completions:parent-model");
      // An ordinary delegation of the same parent, for comparison.
      const receipt = await service.delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        task: "ORDINARY delegated task",
        mode: "foreground",
        toolCallId: "call-ordinary",
      });
      expect(receipt.kind).toBe("result");
      const def = parseWorkflowDefinition(`
name: models
nodes:
  - { id: plain, task: "NODE plain" }
  - { id: pinned, task: "NODE pinned", model: "openai-completions:pinned-model" }
`);
      const started = await engine.start(
        {
          parentSessionId: parent.id,
          principalAccountId: account.id,
          toolCallId: "call-wf",
          currentAccess: async () => service.authorityFor(parent),
          currentWorkDir: async () => null,
          ...hostAccessors(),
        },
        { definition: def },
      );
      const outcome = await engine.finished(started.workflowId);
      expect(outcome.status).toBe("completed");
      expect(outcome.summary).toContain("answered by workflow-default");
      expect(outcome.summary).toContain("answered by pinned-model");

      const byTask = (prefix: string) => provider.requests.filter((r) => r.firstUser.startsWith(prefix));
      const ordinary = byTask("ORDINARY");
      expect(ordinary).toHaveLength(1);
      // The selected models: the workflow's default for an unpinned node, the node's own pin otherwise.
      expect(byTask("NODE plain").map((r) => r.model)).toEqual(["workflow-default"]);
      expect(byTask("NODE pinned").map((r) => r.model)).toEqual(["pinned-model"]);
      // The account's normal provider credentials, exactly as the ordinary delegation used them.
      for (const r of [...byTask("NODE plain"), ...byTask("NODE pinned")])
        expect(r.authorization).toBe(ordinary[0]?.authorization);
      expect(ordinary[0]?.authorization).toBe("Bearer account-key");
      // The same runner pool: every delegated turn, node or not, was placed in a runner.
      const { rows } = await db.pool.query("select id from sessions where parent_session_id = $1::uuid", [
        parent.id,
      ]);
      expect(rows).toHaveLength(3);
      for (const { id } of rows)
        expect(placements.filter((p) => p.sessionId === id).map((p) => p.placement)).toEqual(["runner"]);
      expect(pool.health().runners.length).toBe(1);
      // The account's usage: every child's answer carries the provider's usage, nodes as the ordinary one.
      const usage = await db.pool.query(
        `select s.id::text, (select count(*)::int from journal_entries j
            where j.session_id = s.id and (j.provider_usage->>'totalTokens')::int = 9) as n
           from sessions s where s.parent_session_id = $1::uuid`,
        [parent.id],
      );
      expect(usage.rows.map((r) => r.n)).toEqual([1, 1, 1]);
    } finally {
      await engine.close();
      await service.close();
      await pool.close();
      await provider.close();
    }
  }, 120_000);
});
