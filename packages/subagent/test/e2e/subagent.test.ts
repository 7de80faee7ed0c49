import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import {
  createScriptedTurnRunner,
  DelegationService,
  type DelegationServiceOptions,
  FileSpillStore,
  type SessionTurnRunner,
  scriptTask,
} from "@crw/brain";
import { PgDelegationRepository, type TranscriptMessage } from "@crw/db";
import {
  type Placement,
  RunnerStartupError,
  runWithWorkflowNodeDispatch,
  type SubagentRunnerPoolDeps,
  SubagentSessionDispatch,
} from "@crw/subagent";
import { useTestDatabase } from "@crw/tools/pg";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { closePoolsAfterEach, makePool } from "../support/pools.js";
import { waitFor } from "../support/runners.js";
import { tempDir } from "../support/tmp.js";

const db = useTestDatabase();
closePoolsAfterEach();
// An own pg pool, ended before the harness drops the database (so no client is cut off mid-goodbye).
let pgPool: pg.Pool;
beforeAll(() => {
  pgPool = new pg.Pool({ connectionString: db.url, max: 8 });
  pgPool.on("error", () => {});
});
afterAll(async () => {
  await pgPool.end();
});

/**
 * test:e2e:subagent: delegated work on PostgreSQL through the default forked path. The delegation core is
 * unchanged; its SessionTurnRunner is the dispatch, and every turn is asserted to have run in a runner,
 * with no environment switch.
 */
const services: DelegationService[] = [];
afterAll(async () => {
  await Promise.all(services.map((s) => s.close()));
});

function assemble(
  size: { maxRunners: number; turnsPerRunner: number } = { maxRunners: 2, turnsPerRunner: 4 },
  tools?: DelegationServiceOptions["tools"],
  runner: {
    kind?: "agent" | "scripted";
    pool?: Partial<SubagentRunnerPoolDeps>;
    /** Collects what the dispatch throws at the delegation core. */
    thrown?: Error[];
  } = {},
) {
  const { pool, events } = makePool({ size, ...runner.pool });
  const placements: Placement[] = [];
  const placed: { sessionId: string; placement: Placement }[] = [];
  const repo = new PgDelegationRepository(pgPool);
  const dispatch = new SubagentSessionDispatch({
    pool,
    inProcess: createScriptedTurnRunner(),
    runnerKind: runner.kind ?? "scripted",
    onPlaced: (request, placement) => {
      placements.push(placement);
      placed.push({ sessionId: request.sessionId, placement });
    },
    // As the daemon does: a child's channel is its parent session; the parent is read from its row.
    placementOf: async (request) => {
      const row = await repo.getSession(request.sessionId, request.principalAccountId);
      return row.parentSessionId
        ? { channelId: row.parentSessionId, parentSessionId: row.parentSessionId }
        : { channelId: row.id };
    },
  });
  const seam: SessionTurnRunner = {
    runTurn: (request, host) =>
      dispatch.runTurn(request, host).catch((e: Error) => {
        runner.thrown?.push(e);
        throw e;
      }),
  };
  const service = new DelegationService({
    repo,
    runner: runner.thrown ? seam : dispatch,
    spill: new FileSpillStore(tempDir("spill")),
    helperWaitMs: 200,
    ...(tools && { tools }),
  });
  services.push(service);
  return { service, repo, events, placements, placed, pool };
}

/**
 * A new account's root session whose turn delegates once, to a child answering `childAnswer`, and then
 * answers "parent done".
 */
async function delegateOnce(
  { service, repo }: Pick<ReturnType<typeof assemble>, "service" | "repo">,
  childAnswer: string,
) {
  const account = await repo.createAccount({ name: `acct-${randomUUID()}` });
  const parent = await service.createRootSession(account.id, "scripted");
  const outcome = await service.prompt(
    parent.id,
    account.id,
    scriptTask({
      rounds: [[{ name: "Delegate", arguments: { task: scriptTask({ answer: childAnswer }) } }]],
      answer: "parent done",
    }),
  );
  return { account, parent, outcome };
}

/** A host tool that records what `read` reports when a turn calls it, so a test observes from inside the turn. */
const probe = (name: string, read: () => string | undefined, seen: (string | undefined)[]) => ({
  name,
  description: "records what the daemon reports for the calling session",
  parameters: {},
  mutates: false,
  execute: async () => {
    seen.push(read());
    return { content: "recorded" };
  },
});

const messagesOf = (entries: { body: { type: string; message?: TranscriptMessage } }[]) =>
  entries.flatMap((e) => (e.body.type === "message" && e.body.message ? [e.body.message] : []));

describe("test:e2e:subagent", () => {
  it("a foreground delegation runs parent and child turns in forked runners and delivers the result once", async () => {
    const { service, repo, events, placements } = assemble();
    const { account, parent, outcome } = await delegateOnce({ service, repo }, "child did the work");
    expect(outcome.stopReason).toBe("stop");
    await service.whenIdle();
    const journal = messagesOf(await repo.readJournal(parent.id, account.id));
    expect(journal.find((m) => m.role === "toolResult")).toMatchObject({
      toolName: "Delegate",
      content: "child did the work",
      isError: false,
    });
    expect(journal.at(-1)).toMatchObject({
      role: "assistant",
      content: [{ type: "text", text: "parent done" }],
    });
    expect(await repo.settledResultIds(parent.id, account.id)).toHaveLength(1);
    // Runner use, unconditionally: the parent (a root session) ran in the daemon, the child in a runner.
    expect(placements).toEqual(["in-process", "runner"]);
    expect(events.filter((e) => e.type === "turn_dispatched")).toHaveLength(1);
  });

  it("a child whose runner cannot start fails the parent's Delegate call with an error result naming the typed startup failure; it never runs in the daemon (S004-163)", async () => {
    const thrown: Error[] = [];
    const { service, repo, placed } = assemble(undefined, undefined, {
      pool: { env: { CRW_RUNNER_FAULT: "exit-before-hello" } },
      thrown,
    });
    const { account, parent, outcome } = await delegateOnce({ service, repo }, "never");
    expect(outcome.stopReason).toBe("stop");
    await service.whenIdle();
    const journal = messagesOf(await repo.readJournal(parent.id, account.id));
    const result = journal.find((m) => m.role === "toolResult");
    expect(result).toMatchObject({ toolName: "Delegate", isError: true });
    const run = await repo.runForToolCall(
      parent.id,
      (result as { toolCallId: string }).toolCallId,
      account.id,
    );
    expect(run).toMatchObject({ status: "failed", error: { code: "child_failed" } });
    expect((result as { content: string }).content).toBe(thrown[0]?.message);
    // what the delegation core caught from the child's turn: the typed startup failure, nothing generic
    expect(thrown).toHaveLength(1);
    expect(thrown[0]).toBeInstanceOf(RunnerStartupError);
    expect(thrown[0]).toMatchObject({ code: "runner_startup", category: expect.any(String) });
    // the child's turn was placed in a runner only: no fallback ran it in the daemon
    expect(placed.filter((p) => p.sessionId === run?.childSessionId).map((p) => p.placement)).toEqual([
      "runner",
    ]);
  });

  it("background children run in runners while the parent continues; each result is delivered exactly once", async () => {
    const { service, repo, events } = assemble();
    const account = await repo.createAccount({ name: `acct-${randomUUID()}` });
    const parent = await service.createRootSession(account.id, "scripted");
    const n = 3;
    await service.prompt(
      parent.id,
      account.id,
      scriptTask({
        rounds: [
          Array.from({ length: n }, (_, i) => ({
            name: "Delegate",
            arguments: { task: scriptTask({ answer: `child ${i}` }), background: true },
          })),
        ],
        answer: "dispatched all",
      }),
    );
    await service.whenIdle();
    const settled = await repo.settledResultIds(parent.id, account.id);
    expect(settled).toHaveLength(n);
    expect(new Set(settled).size).toBe(n);
    expect(events.filter((e) => e.type === "turn_dispatched").length).toBeGreaterThanOrEqual(n);
  });

  it("a full pool queues the child turn: its session and run row are durable before the wait, and the pool reports it queued until its dispatch starts it (S004-186)", async () => {
    let openGate: () => void = () => {};
    const gate = new Promise<void>((r) => {
      openGate = r;
    });
    // The child's own turn reads the pool's state of its session from inside, once dispatch has started it.
    const seenByChild: (string | undefined)[] = [];
    const { service, repo, pool } = assemble({ maxRunners: 1, turnsPerRunner: 1 }, (session) => [
      probe("Observe", () => pool.sessionState(session.id), seenByChild),
      {
        name: "Gate",
        description: "holds the parent's turn (and so the only runner slot) until the test opens it",
        parameters: {},
        mutates: false,
        execute: async () => {
          await Promise.race([gate, new Promise((r) => setTimeout(r, 15_000))]);
          return { content: "open" };
        },
      },
    ]);
    const account = await repo.createAccount({ name: `acct-${randomUUID()}` });
    const parent = await service.createRootSession(account.id, "scripted");
    const run = service.prompt(
      parent.id,
      account.id,
      scriptTask({
        rounds: [
          [
            {
              name: "Delegate",
              arguments: {
                task: scriptTask({
                  rounds: [[{ name: "Observe", arguments: {} }]],
                  answer: "queued child done",
                }),
                background: true,
              },
            },
          ],
          [{ name: "Gate", arguments: {} }],
        ],
        answer: "parent done",
      }),
    );
    const child = await (async () => {
      let found: { id: string } | undefined;
      await waitFor(async () => {
        const rows = await pgPool.query<{ id: string }>(
          "select id from sessions where parent_session_id = $1",
          [parent.id],
        );
        found = rows.rows[0];
        return found !== undefined && pool.sessionState(found.id) === "queued";
      }, 15_000);
      return found as { id: string };
    })();
    // While the child waits in the queue: its session and run row are already in PostgreSQL.
    const runs = await pgPool.query<{ status: string; mode: string }>(
      "select status, mode from subagent_runs where child_session_id = $1",
      [child.id],
    );
    expect(runs.rows).toEqual([{ status: expect.any(String), mode: "background" }]);
    expect(pool.sessionState(child.id)).toBe("queued");
    expect(pool.health().queued).toBe(1);
    expect(seenByChild).toEqual([]);
    openGate();
    expect((await run).stopReason).toBe("stop");
    await service.whenIdle();
    // Once dispatched it is no longer queued: running while its turn runs, gone once it settled.
    expect(seenByChild).toEqual(["running"]);
    expect(pool.sessionState(child.id)).toBeUndefined();
    expect(await repo.settledResultIds(parent.id, account.id)).toHaveLength(1);
  });

  it("a nested turn takes a slot of the runner it shares with its parent: a full runner makes the pool grow, and a turn on another runner is no nested edge (S004-493 S004-494)", async () => {
    const { service, repo, events } = assemble({ maxRunners: 2, turnsPerRunner: 2 });
    const account = await repo.createAccount({ name: `acct-${randomUUID()}` });
    const parent = await service.createRootSession(account.id, "scripted");
    const delegating = (task: string, answer: string) =>
      scriptTask({ rounds: [[{ name: "Delegate", arguments: { task } }]], answer });
    const greatGrandchild = scriptTask({ answer: "great-grandchild answer" });
    const child = delegating(delegating(greatGrandchild, "grandchild relayed"), "child relayed");
    const outcome = await service.prompt(parent.id, account.id, delegating(child, "parent done"));
    expect(outcome.stopReason).toBe("stop");
    await service.whenIdle();
    const dispatched = events.flatMap((e) => (e.type === "turn_dispatched" ? [e] : []));
    const [first, second, third] = dispatched.map((e) => e.runnerId);
    // The child and its nested grandchild fill the first runner (two turns each), so the great-grandchild
    // waits for a second one the pool grows.
    expect(dispatched).toHaveLength(3);
    expect(second).toBe(first);
    expect(third).not.toBe(first);
    // The child (under a root parent) is no nested edge; the grandchild (same runner as its parent) is;
    // the great-grandchild, on another runner than its parent, is not.
    expect(dispatched.map((e) => e.nested)).toEqual([false, true, false]);
    const journal = messagesOf(await repo.readJournal(parent.id, account.id));
    expect(journal.find((m) => m.role === "toolResult")).toMatchObject({ content: "child relayed" });
  });

  it("the real delegation core, dispatcher and context place an exact protected child in the daemon after its assertion; others stay in runners (S004-379 S004-374)", async () => {
    // A turn's own view of its session's runner route, read from inside the turn.
    const routeSeen: (string | undefined)[] = [];
    const { service, repo, placements, placed, events, pool } = assemble(undefined, (session) => [
      probe("Route", () => pool.routeOf(session.id), routeSeen),
    ]);
    const account = await repo.createAccount({ name: `acct-${randomUUID()}` });
    const parent = await service.createRootSession(account.id, "scripted");
    await service.prompt(
      parent.id,
      account.id,
      scriptTask({
        rounds: [[{ name: "Delegate", arguments: { task: scriptTask({ answer: "first answer" }) } }]],
        answer: "parent done",
      }),
    );
    await service.whenIdle();
    const childId = (
      await pgPool.query<{ id: string }>("select id from sessions where parent_session_id = $1", [parent.id])
    ).rows[0]?.id as string;
    expect(placements).toEqual(["in-process", "runner"]);
    const firstRunner = pool.routeOf(childId);
    expect(firstRunner).toEqual(expect.any(String));
    const dispatchedBefore = events.filter((e) => e.type === "turn_dispatched").length;
    // The controlled native boundary: the assertion records how many turns had been placed when it ran.
    const asserted: { child: string; placedBefore: number }[] = [];
    const scope = {
      parentSessionId: parent.id,
      channelId: parent.id,
      childSessionId: childId,
      assertDispatch: async (child: string) => {
        asserted.push({ child, placedBefore: placements.length });
      },
    };
    const receipt = await runWithWorkflowNodeDispatch(scope, () =>
      service.continueSubagent({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        childSessionId: childId,
        toolCallId: `recovery-${randomUUID()}`,
        text: scriptTask({ rounds: [[{ name: "Route", arguments: {} }]], answer: "continued in the daemon" }),
        mode: "foreground",
      }),
    );
    expect(receipt).toMatchObject({ kind: "result", outcome: "ok", body: "continued in the daemon" });
    expect(asserted).toEqual([{ child: childId, placedBefore: 2 }]);
    expect(placed.filter((p) => p.sessionId === childId).map((p) => p.placement)).toEqual([
      "runner",
      "in-process",
    ]);
    expect(events.filter((e) => e.type === "turn_dispatched").length).toBe(dispatchedBefore);
    // Its route to the runner of its first turn was retired before its turn ran in the daemon.
    expect(routeSeen).toEqual([undefined]);
    expect(pool.routeOf(childId)).toBeUndefined();
    // A fresh child of the same parent, in the same scope, is ordinary work: it keeps runner placement.
    await runWithWorkflowNodeDispatch(scope, () =>
      service.prompt(
        parent.id,
        account.id,
        scriptTask({
          rounds: [[{ name: "Delegate", arguments: { task: scriptTask({ answer: "fresh child" }) } }]],
          answer: "parent done again",
        }),
      ),
    );
    await service.whenIdle();
    const children = placed.filter((p) => p.sessionId !== parent.id);
    expect(children.map((p) => p.placement)).toEqual(["runner", "in-process", "runner"]);
    expect(children[2]?.sessionId).not.toBe(childId);
    expect(placed.filter((p) => p.sessionId === parent.id).every((p) => p.placement === "in-process")).toBe(
      true,
    );
    expect(asserted).toHaveLength(1);
  });

  it("an assistant row journaled from a runner carries its provider response's usage; the usage frames stay the per-response source", async () => {
    // OpenAI Chat Completions over SSE on loopback: one answer with usage figures, part of the prompt cached.
    const server = createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        const chunk = (delta: object, finish: string | null, usage?: object) =>
          `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", created: 0, model: "m", choices: [{ index: 0, delta, finish_reason: finish }], ...(usage && { usage }) })}\n\n`;
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.end(
          chunk({ role: "assistant", content: "measured" }, null) +
            chunk({}, "stop", {
              prompt_tokens: 40,
              completion_tokens: 6,
              total_tokens: 46,
              prompt_tokens_details: { cached_tokens: 30 },
            }) +
            "data: [DONE]\n\n",
        );
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    try {
      const baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
      const { service, repo, pool, placed } = assemble(undefined, undefined, {
        kind: "agent",
        pool: {
          agentOptions: () => ({
            baseUrls: { "openai-completions": baseUrl },
            apiKeyEnv: { "openai-completions": "CRW_E2E_USAGE_KEY" },
          }),
          env: { CRW_E2E_USAGE_KEY: "k" },
        },
      });
      const frames: Parameters<Parameters<typeof pool.attachProviderUsageSink>[0]>[0][] = [];
      pool.attachProviderUsageSink((r) => frames.push(r));
      const account = await repo.createAccount({ name: `acct-${randomUUID()}` });
      const parent = await service.createRootSession(account.id, "scripted");
      const receipt = await service.delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: `call-${randomUUID()}`,
        task: "measure this",
        mode: "foreground",
        model: "openai-completions:m",
      });
      await service.whenIdle();
      const child = placed.find((p) => p.sessionId !== parent.id);
      expect(child?.placement).toBe("runner");
      const childId = child?.sessionId ?? "";
      expect(JSON.stringify(receipt)).toContain(childId);
      const { rows } = await pgPool.query<{ role: string; usage: unknown }>(
        `select role, provider_usage as usage from journal_entries
          where session_id = $1::uuid and kind = 'message' order by seq`,
        [childId],
      );
      const expected = {
        api: "openai-completions",
        provider: "openai",
        model: "m",
        stopReason: "stop",
        input: 10,
        output: 6,
        cacheRead: 30,
        cacheWrite: 0,
        totalTokens: 46,
      };
      const assistant = rows.filter((r) => r.role === "assistant");
      expect(assistant).toHaveLength(1);
      expect(assistant[0]?.usage).toMatchObject(expected);
      // Only the assistant row carries usage; the read path returns it with the row.
      expect(rows.filter((r) => r.role !== "assistant").every((r) => r.usage === null)).toBe(true);
      const [recent] = await repo.recentAssistantMessages(childId, account.id, 1);
      expect(recent?.usage).toMatchObject(expected);
      // One providerUsage frame per response, as before: the journal column is not a second report.
      await waitFor(() => frames.length >= 1);
      expect(frames).toHaveLength(1);
      expect(frames[0]).toMatchObject({ sessionId: childId, usage: expected });
      // The delegation core's diagnostics read it from the row.
      const diag = await service.forkPrefixDiagnostics(childId, account.id);
      expect(diag.response).toMatchObject({ promptTokens: 40, usage: { cacheRead: 30 } });
    } finally {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
  });
});
