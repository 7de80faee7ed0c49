import { PgDelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  type MutatingTool,
  PERSONA_TEMPLATES,
  type SessionTurnRunner,
  type TurnRequest,
} from "../../src/index.js";
import {
  askForFork,
  continueForeground,
  delegateForeground,
  makeService,
  messages,
  newParent,
  recording,
  scriptTask,
} from "./helpers.js";

const db = useTestDatabase();

/** `runner`, with `see` called on each turn request before the turn runs. */
function beforeEachTurn(runner: SessionTurnRunner, see: (request: TurnRequest) => void): SessionTurnRunner {
  return {
    runTurn: (request, host) => {
      see(request);
      return runner.runTurn(request, host);
    },
  };
}

describe("the prompt and context a child's turn gets", () => {
  it("an ordinary non-fork child takes the worker route, with a typed or a generic role (S004-001)", async () => {
    const { seen, runner } = recording();
    const { service } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service);
    for (const [i, role] of [undefined, "tester"].entries()) {
      await service.delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: `d${i}`,
        task: "look around",
        mode: "foreground",
        ...(role ? { role, context: "from the parent" } : {}),
      });
    }
    await service.whenIdle();
    const children = seen.filter((r) => r.sessionId !== parent.id);
    const [generic, typed] = children;
    expect(children).toHaveLength(2);
    // the idle root's follow-up turns (for these results) take the interactive route
    expect(seen.find((r) => r.sessionId === parent.id)?.systemPrompt).toContain(
      PERSONA_TEMPLATES.conversational,
    );
    for (const request of [generic, typed]) {
      expect(request?.systemPrompt).toContain(PERSONA_TEMPLATES["delegated/worker"]);
      expect(request?.systemPrompt).not.toContain(PERSONA_TEMPLATES.conversational);
    }
    expect(typed?.systemPrompt).toContain("# Role: tester");
    expect(typed?.systemPrompt).toContain("from the parent");
    // the child's scope travels with its request; the worker gets the delegation tools too
    expect(typed?.scope?.role).toBe("tester");
    expect(typed?.tools.map((t) => t.name)).toEqual(["Delegate", "DelegateContinue", "DelegateRead"]);
  });

  it("a fork continues with its parent's byte-identical prompt, toolset and settled prefix (S004-017)", async () => {
    const { seen, runner } = recording();
    const { service, repo } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service);
    await service.prompt(parent.id, account.id, "some earlier conversation");
    await askForFork(service, { parent, account });
    const parentRequest = seen.find((r) => r.sessionId === parent.id && r.context.length > 2);
    const forkRequest = seen.find((r) => r.sessionId !== parent.id);
    if (!parentRequest || !forkRequest) throw new Error("missing requests");
    expect(forkRequest.systemPrompt).toBe(parentRequest.systemPrompt);
    // the toolset as declared to the provider: names, descriptions and argument schemas, in order
    const declared = (r: typeof parentRequest) =>
      JSON.stringify(r.tools.map((t) => [t.name, t.description, t.parameters]));
    expect(declared(forkRequest)).toBe(declared(parentRequest));
    expect(JSON.stringify(forkRequest.context.slice(0, parentRequest.context.length))).toBe(
      JSON.stringify(parentRequest.context),
    );
    expect(forkRequest.context.at(-1)).toEqual({
      role: "user",
      content: scriptTask({ answer: "forked ok" }),
    });
    const toolResult = messages(await repo.readJournal(parent.id, account.id)).find(
      (m) => m.role === "toolResult",
    );
    expect(toolResult).toMatchObject({ content: "forked ok", isError: false });
  });

  it("a fork's context copy is awaited after its admission committed, holding no lock on the parent (S004-243)", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const log: string[] = [];
    const atCopyStart: unknown[] = [];
    const copy = repo.copyJournalBranch;
    repo.copyJournalBranch = async (source, target, principal, upto) => {
      log.push("copy started");
      // From another connection: the call's row is committed, and the parent's row can be locked at once.
      const admitted = await db.pool.query("select 1 from subagent_runs where child_session_id = $1", [
        target,
      ]);
      const client = await db.pool.connect();
      try {
        await client.query("begin");
        const locked = await client
          .query("select 1 from sessions where id = $1 for update nowait", [source])
          .then(
            (q) => q.rowCount,
            (e: { code?: string }) => e.code,
          );
        await client.query("rollback");
        atCopyStart.push(admitted.rowCount, locked);
      } finally {
        client.release();
      }
      const rows = await copy(source, target, principal, upto);
      await new Promise((r) => setTimeout(r, 100));
      log.push("copy returned");
      return rows;
    };
    const { seen, runner } = recording();
    const { service } = makeService(db.pool, {
      repo,
      runner: beforeEachTurn(runner, (request) => {
        if (request.sessionId !== parent.id) log.push("fork turn");
      }),
    });
    const { account, parent } = await newParent(service);
    await service.prompt(parent.id, account.id, "some earlier conversation");
    await askForFork(service, { parent, account });
    expect(atCopyStart).toEqual([1, 1]);
    expect(log).toEqual(["copy started", "copy returned", "fork turn"]);
    const fork = seen.find((r) => r.sessionId !== parent.id);
    expect(fork?.context.map((m) => m.role).slice(0, 2)).toEqual(["user", "assistant"]);
  });

  it("a fork child stays private until its copied context has committed: no reader finds it before, its turn runs after (S004-244)", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const log: string[] = [];
    const whileCopying: string[] = [];
    const codeOf = (p: Promise<unknown>) =>
      p.then(
        () => "found",
        (e: { code?: string }) => e.code ?? "error",
      );
    const copy = repo.copyJournalBranch;
    repo.copyJournalBranch = async (source, target, principal, upto) => {
      const rows = await copy(source, target, principal, upto);
      // a long copy: anything that does not wait for it shows up before it ends
      await new Promise((r) => setTimeout(r, 300));
      log.push("copied");
      whileCopying.push(
        await codeOf(repo.getSession(target, principal)),
        await codeOf(repo.readJournal(target, principal)),
        await codeOf(repo.getChildSession(source, target, principal)),
      );
      return rows;
    };
    const commit = repo.commitFork;
    repo.commitFork = async (sessionId, principal) => {
      await commit(sessionId, principal);
      log.push("committed");
    };
    const { seen, runner } = recording();
    const { service } = makeService(db.pool, {
      repo,
      runner: beforeEachTurn(runner, (request) => log.push(`turn ${request.sessionId}`)),
    });
    const { account, parent } = await newParent(service);
    await service.prompt(parent.id, account.id, "some earlier conversation");
    await askForFork(service, { parent, account });
    const fork = seen.find((r) => r.sessionId !== parent.id)?.sessionId as string;
    expect(fork).toBeDefined();
    expect(whileCopying).toEqual(["not_found", "not_found", "not_found"]);
    const forkLog = log.filter((l) => !l.startsWith("turn ") || l === `turn ${fork}`);
    expect(forkLog.slice(0, 3)).toEqual(["copied", "committed", `turn ${fork}`]);
    expect((await repo.getSession(fork, account.id)).id).toBe(fork);
  });

  it("a read-only continuation runs its turn under the clamp while the permanent scope keeps composing the prompt and the next call (S004-221)", async () => {
    const { seen, runner } = recording();
    const { service } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service);
    const first = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "d",
      task: "t",
      mode: "foreground",
      role: "analyst",
    });
    if (first.kind !== "result") throw new Error("expected result");
    await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: first.childSessionId,
      toolCallId: "c",
      text: "plan only",
      mode: "foreground",
      callerReadOnly: true,
    });
    // the clamp is the call's only: the next continuation runs on the child's permanent scope again
    await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: first.childSessionId,
      toolCallId: "c2",
      text: "now build",
      mode: "foreground",
    });
    const turns = seen.filter((r) => r.sessionId === first.childSessionId);
    expect(turns.map((r) => r.readOnly)).toEqual([false, true, false]);
    expect(turns.map((r) => r.scope?.permissionBoundary === "read-only")).toEqual([false, true, false]);
    expect(turns[2]?.scope).toEqual(turns[0]?.scope);
    expect(turns[1]?.systemPrompt).toBe(turns[0]?.systemPrompt);
    expect(turns[2]?.systemPrompt).toBe(turns[0]?.systemPrompt);
    expect(turns[1]?.systemPrompt).toContain("# Role: analyst");
  });

  it("a child's prompt is composed once per spawn and reused by every later turn (S004-019)", async () => {
    const { seen, runner } = recording();
    let extra: MutatingTool[] = [];
    const { service } = makeService(db.pool, { runner, tools: () => extra });
    const { account, parent } = await newParent(service);
    const first = await delegateForeground(service, { parent, account }, "d", "t");
    if (first.kind !== "result") throw new Error("expected result");
    // the host's tool catalog changes after the spawn: a recomposition would list the new tool
    extra = [
      {
        name: "Lately",
        description: "added after the spawn",
        parameters: {},
        execute: async () => ({ content: "" }),
      },
    ];
    await continueForeground(service, { parent, account }, first.childSessionId, "c", "again");
    const turns = seen.filter((r) => r.sessionId === first.childSessionId);
    expect(turns).toHaveLength(2);
    expect(turns[1]?.systemPrompt).toBe(turns[0]?.systemPrompt);
    expect(turns[1]?.systemPrompt).not.toContain("Lately");
    expect(turns[1]?.tools.map((t) => t.name)).toContain("Lately");
    const stored = await db.pool.query<{ system_prompt: string }>(
      "select system_prompt from sessions where id = $1",
      [first.childSessionId],
    );
    expect(stored.rows[0]?.system_prompt).toBe(turns[0]?.systemPrompt);
  });
});
