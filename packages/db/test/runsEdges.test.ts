import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import pg from "pg";
import { describe, expect, it } from "vitest";
import {
  addWakeFilter,
  INBOX_WAKE_CHANNEL,
  JOURNAL_WAKE_CHANNEL,
  type NewDelegation,
  PgDelegationRepository,
} from "../src/index.js";

const db = useTestDatabase();
const repo = () => new PgDelegationRepository(db.pool);

async function root() {
  const r = repo();
  const account = await r.createAccount({ name: `ru-${randomUUID().slice(0, 8)}` });
  const parent = await r.createRootSession(account.id, "scripted");
  return { r, account, parent };
}

const delegation = (
  parentSessionId: string,
  principalAccountId: string,
  over: Partial<NewDelegation> = {},
) => ({
  parentSessionId,
  principalAccountId,
  toolCallId: "call-1",
  task: "the task",
  mode: "background" as const,
  model: "scripted",
  scope: '{"s":1}',
  ...over,
});

/** A parent with one delegated child whose first call is settled: ready for a continuation. */
async function idleChild() {
  const { r, account, parent } = await root();
  const { run, child } = await r.createDelegation(delegation(parent.id, account.id));
  await r.settleRun({
    runId: run.id,
    generation: run.generation,
    resultId: randomUUID(),
    outcome: "ok",
    body: "",
    byteSize: 0,
  });
  return { r, account, parent, child, first: run };
}

const continuation = (
  parentSessionId: string,
  principalAccountId: string,
  childSessionId: string,
  toolCallId = "cont-1",
) => ({
  parentSessionId,
  principalAccountId,
  childSessionId,
  toolCallId,
  task: "more",
  mode: "foreground" as const,
  readOnlyScope: null,
});

const resultsOf = async (runId: string) =>
  (
    await db.pool.query<{ id: string }>("select id from delegation_results where run_id = $1", [runId])
  ).rows.map((x) => x.id);

describe("a Delegate call's rows", () => {
  it("the child and its queued run carry the call's fields; the same call again returns them, created false", async () => {
    const { r, account, parent } = await root();
    const first = await r.createDelegation(delegation(parent.id, account.id));
    expect(first.created).toBe(true);
    expect(first.child).toMatchObject({
      kind: "delegated",
      parentSessionId: parent.id,
      principalAccountId: account.id,
      model: "scripted",
      scope: '{"s":1}',
    });
    expect(first.run).toMatchObject({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "call-1",
      childSessionId: first.child.id,
      kind: "delegate",
      mode: "background",
      task: "the task",
      status: "queued",
      generation: 1,
    });
    expect(await r.getSession(first.child.id, account.id)).toMatchObject({ id: first.child.id });
    const again = await r.createDelegation(delegation(parent.id, account.id, { task: "other" }));
    expect(again).toEqual({ ...first, created: false });
  });

  it("a fork's child is private and names the session it was forked from", async () => {
    const { r, account, parent } = await root();
    const fork = await r.createDelegation(
      delegation(parent.id, account.id, { fork: { fromSessionId: parent.id } }),
    );
    const { rows } = await db.pool.query(
      "select visibility, fork_of_session_id from sessions where id = $1",
      [fork.child.id],
    );
    expect(rows[0]).toEqual({ visibility: "private", fork_of_session_id: parent.id });
    const plain = await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "plain" }));
    const { rows: plainRows } = await db.pool.query(
      "select visibility, fork_of_session_id from sessions where id = $1",
      [plain.child.id],
    );
    expect(plainRows[0]).toEqual({ visibility: "visible", fork_of_session_id: null });
  });

  it("an isolated child's worktree is recorded with it, once: a retried call records nothing more", async () => {
    const { r, account, parent } = await root();
    const worktree = {
      repoRoot: "/repo",
      path: `/wt/${randomUUID()}`,
      branch: "crw/child",
      baseCommit: "a".repeat(40),
      startedFromBranch: "main",
    };
    const first = await r.createDelegation(delegation(parent.id, account.id, { worktree }));
    expect(await r.isolatedWorktree(first.child.id, account.id)).toMatchObject({
      ...worktree,
      sessionId: first.child.id,
    });
    const again = await r.createDelegation(delegation(parent.id, account.id, { worktree }));
    expect(again.created).toBe(false);
    expect(again.child.id).toBe(first.child.id);
    // a bad worktree rolls the child back with it
    await expect(
      r.createDelegation(
        delegation(parent.id, account.id, {
          toolCallId: "bad-wt",
          worktree: { ...worktree, path: `/wt/${randomUUID()}`, baseCommit: "nope" },
        }),
      ),
    ).rejects.toThrow();
    expect(await r.runForToolCall(parent.id, "bad-wt", account.id)).toBeNull();
  });

  it("a parent that does not exist, is private or is another account's is refused, and nothing is created", async () => {
    const { r, account, parent } = await root();
    const missing = randomUUID();
    await expect(r.createDelegation(delegation(missing, account.id))).rejects.toMatchObject({
      code: "not_found",
      message: "parent session not found",
      context: { parentSessionId: missing },
    });
    const fork = await r.createDelegation(
      delegation(parent.id, account.id, { toolCallId: "f", fork: { fromSessionId: parent.id } }),
    );
    await expect(r.createDelegation(delegation(fork.child.id, account.id))).rejects.toMatchObject({
      code: "not_found",
      context: { parentSessionId: fork.child.id },
    });
    const other = await r.createAccount({ name: `x-${randomUUID().slice(0, 8)}` });
    await expect(r.createDelegation(delegation(parent.id, other.id))).rejects.toMatchObject({
      code: "cross_account",
      message: "the parent session belongs to another account",
      context: { parentSessionId: parent.id },
    });
    expect(await r.runForToolCall(parent.id, "call-1", account.id)).toBeNull();
  });

  it("a retried call whose child is gone is not_found for the child, and no second child is made", async () => {
    const { r, account, parent } = await root();
    const first = await r.createDelegation(delegation(parent.id, account.id));
    await db.pool.query("delete from sessions where id = $1", [first.child.id]);
    await expect(r.createDelegation(delegation(parent.id, account.id))).rejects.toMatchObject({
      code: "not_found",
      message: "child session not found",
      context: { runId: first.run.id },
    });
    const { rows } = await db.pool.query(
      "select count(*)::int as n from sessions where parent_session_id = $1",
      [parent.id],
    );
    expect(rows[0]?.n).toBe(0);
  });

  it("a tool call id of 1 to 200 characters is taken; empty or longer is invalid_input, for both kinds of call", async () => {
    const { r, account, parent, child } = await idleChild();
    const refused = { code: "invalid_input", message: "tool call id must be 1..200 characters" };
    await expect(
      r.createDelegation(delegation(parent.id, account.id, { toolCallId: "" })),
    ).rejects.toMatchObject(refused);
    await expect(
      r.createDelegation(delegation(parent.id, account.id, { toolCallId: "x".repeat(201) })),
    ).rejects.toMatchObject(refused);
    expect(
      (await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "y".repeat(200) }))).created,
    ).toBe(true);
    expect((await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "z" }))).created).toBe(
      true,
    );
    await expect(
      r.createContinuation(continuation(parent.id, account.id, child.id, "")),
    ).rejects.toMatchObject(refused);
    await expect(
      r.createContinuation(continuation(parent.id, account.id, child.id, "c".repeat(201))),
    ).rejects.toMatchObject(refused);
    expect(
      (await r.createContinuation(continuation(parent.id, account.id, child.id, "c".repeat(200)))).created,
    ).toBe(true);
  });

  it("malformed ids are refused naming the argument", async () => {
    const { r, account, parent } = await root();
    const bad = "not-a-uuid";
    const refusal = (what: string) => ({
      code: "invalid_input",
      message: `${what} is not a uuid`,
      context: { [what]: bad },
    });
    await expect(r.createDelegation(delegation(bad, account.id))).rejects.toMatchObject(
      refusal("parentSessionId"),
    );
    await expect(r.createDelegation(delegation(parent.id, bad))).rejects.toMatchObject(
      refusal("principalAccountId"),
    );
    await expect(r.createContinuation(continuation(bad, account.id, parent.id))).rejects.toMatchObject(
      refusal("parentSessionId"),
    );
    await expect(r.createContinuation(continuation(parent.id, account.id, bad))).rejects.toMatchObject(
      refusal("childSessionId"),
    );
    await expect(r.createContinuation(continuation(parent.id, bad, parent.id))).rejects.toMatchObject(
      refusal("principalAccountId"),
    );
    await expect(r.getRun(bad, account.id)).rejects.toMatchObject(refusal("runId"));
    await expect(r.runForToolCall(bad, "t", account.id)).rejects.toMatchObject(refusal("parentSessionId"));
    await expect(r.openRunForChild(bad, account.id)).rejects.toMatchObject(refusal("childSessionId"));
    await expect(r.openChildRuns(bad, account.id)).rejects.toMatchObject(refusal("sessionId"));
    await expect(r.settlementWork(bad, account.id)).rejects.toMatchObject(refusal("sessionId"));
    await expect(r.startRun(bad, 1, "o")).rejects.toMatchObject(refusal("runId"));
    await expect(
      r.settleRun({
        runId: bad,
        generation: 1,
        resultId: randomUUID(),
        outcome: "ok",
        body: "",
        byteSize: 0,
      }),
    ).rejects.toMatchObject(refusal("runId"));
    await expect(
      r.settleRun({
        runId: randomUUID(),
        generation: 1,
        resultId: bad,
        outcome: "ok",
        body: "",
        byteSize: 0,
      }),
    ).rejects.toMatchObject(refusal("resultId"));
    await expect(r.recordRunProgress(bad, account.id, 1, 1, "{}")).rejects.toMatchObject(refusal("runId"));
    await expect(r.recordRunProgress(randomUUID(), bad, 1, 1, "{}")).rejects.toMatchObject(
      refusal("principalAccountId"),
    );
    await expect(r.moveRunToBackground(bad, account.id, 1)).rejects.toMatchObject(refusal("runId"));
    await expect(r.moveRunToBackground(randomUUID(), bad, 1)).rejects.toMatchObject(
      refusal("principalAccountId"),
    );
  });
});

describe("a DelegateContinue call's row", () => {
  it("opens a continue run with its own scope clamp and model; the same call again returns it", async () => {
    const { r, account, parent, child } = await idleChild();
    const input = {
      ...continuation(parent.id, account.id, child.id),
      readOnlyScope: '{"ro":true}',
      model: "other-model",
    };
    const first = await r.createContinuation(input);
    expect(first.created).toBe(true);
    expect(first.run).toMatchObject({
      parentSessionId: parent.id,
      childSessionId: child.id,
      toolCallId: "cont-1",
      kind: "continue",
      mode: "foreground",
      task: "more",
      status: "queued",
      readOnlyScope: '{"ro":true}',
      model: "other-model",
    });
    expect(await r.createContinuation(input)).toEqual({ run: first.run, created: false });
    // the child's own scope did not move (no promotion asked)
    expect((await r.getSession(child.id, account.id)).scope).toBe('{"s":1}');
  });

  it("a promotion replaces the child's scope in the same transaction; a continuation without a model stores none", async () => {
    const { r, account, parent, child } = await idleChild();
    const out = await r.createContinuation({
      ...continuation(parent.id, account.id, child.id),
      promotedScope: '{"s":2}',
    });
    expect(out.run.model).toBeNull();
    expect((await r.getSession(child.id, account.id)).scope).toBe('{"s":2}');
  });

  it("a busy child refuses a second call and its promotion is rolled back with it", async () => {
    const { r, account, parent, child } = await idleChild();
    await r.createContinuation(continuation(parent.id, account.id, child.id, "open-1"));
    await expect(
      r.createContinuation({
        ...continuation(parent.id, account.id, child.id, "open-2"),
        promotedScope: '{"s":3}',
      }),
    ).rejects.toMatchObject({
      code: "conflict",
      message: "the child already has an open call",
      context: { childSessionId: child.id, reason: "child_busy" },
    });
    expect((await r.getSession(child.id, account.id)).scope).toBe('{"s":1}');
    expect(await r.runForToolCall(parent.id, "open-2", account.id)).toBeNull();
  });

  it("a database refusal other than a busy child is passed on as it is", async () => {
    const { r, account, parent, child } = await idleChild();
    const err = await r
      .createContinuation({ ...continuation(parent.id, account.id, child.id), model: "m".repeat(201) })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "23514" });
    expect(await r.openRunForChild(child.id, account.id)).toBeNull();
  });

  it("a child of another parent, a private child or another account's parent is refused", async () => {
    const { r, account, parent, child } = await idleChild();
    const otherParent = await r.createRootSession(account.id, "scripted");
    await expect(
      r.createContinuation(continuation(otherParent.id, account.id, child.id)),
    ).rejects.toMatchObject({
      code: "not_found",
      message: "child session not found",
      context: { childSessionId: child.id },
    });
    const fork = await r.createDelegation(
      delegation(parent.id, account.id, { toolCallId: "f", fork: { fromSessionId: parent.id } }),
    );
    await expect(
      r.createContinuation(continuation(parent.id, account.id, fork.child.id)),
    ).rejects.toMatchObject({
      code: "not_found",
      context: { childSessionId: fork.child.id },
    });
    const stranger = await r.createAccount({ name: `s-${randomUUID().slice(0, 8)}` });
    await expect(r.createContinuation(continuation(parent.id, stranger.id, child.id))).rejects.toMatchObject({
      code: "cross_account",
      message: "the parent session belongs to another account",
      context: { parentSessionId: parent.id },
    });
    const missing = randomUUID();
    await expect(r.createContinuation(continuation(missing, account.id, child.id))).rejects.toMatchObject({
      code: "not_found",
      message: "parent session not found",
      context: { parentSessionId: missing },
    });
  });
});

describe("reading runs", () => {
  it("a run is read by id, by tool call, as a child's open call and among a parent's open calls, for its account only", async () => {
    const { r, account, parent } = await root();
    const a = await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "a" }));
    const b = await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "b" }));
    const c = await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "c" }));
    // created_at orders the open calls, not the order of the ids
    await db.pool.query("update subagent_runs set created_at = now() - interval '1 hour' where id = $1", [
      c.run.id,
    ]);
    await r.settleRun({
      runId: b.run.id,
      generation: 1,
      resultId: randomUUID(),
      outcome: "ok",
      body: "",
      byteSize: 0,
    });
    const stranger = await r.createAccount({ name: `rd-${randomUUID().slice(0, 8)}` });

    expect((await r.getRun(a.run.id, account.id)).id).toBe(a.run.id);
    await expect(r.getRun(a.run.id, stranger.id)).rejects.toMatchObject({
      code: "not_found",
      message: "run not found",
      context: { runId: a.run.id },
    });
    expect((await r.runForToolCall(parent.id, "b", account.id))?.status).toBe("succeeded");
    expect(await r.runForToolCall(parent.id, "b", stranger.id)).toBeNull();
    expect(await r.runForToolCall(parent.id, "none", account.id)).toBeNull();
    expect((await r.openRunForChild(a.child.id, account.id))?.id).toBe(a.run.id);
    expect(await r.openRunForChild(b.child.id, account.id)).toBeNull();
    expect(await r.openRunForChild(a.child.id, stranger.id)).toBeNull();
    expect((await r.openChildRuns(parent.id, account.id)).map((x) => x.id)).toEqual([c.run.id, a.run.id]);
    expect(await r.openChildRuns(parent.id, stranger.id)).toEqual([]);
  });

  it("settlementWork counts open child calls, pending steers to the session and its unacknowledged results, and sees its spills", async () => {
    const { r, account, parent } = await root();
    expect(await r.settlementWork(parent.id, account.id)).toEqual({
      openChildRuns: 0,
      pendingSteers: 0,
      queuedResults: 0,
      spills: false,
    });
    const a = await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "a" }));
    await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "b" }));
    await r.settleRun({
      runId: a.run.id,
      generation: 1,
      resultId: randomUUID(),
      outcome: "ok",
      body: "",
      byteSize: 0,
    });
    await r.enqueueSteer(a.child.id, account.id, "steer one");
    expect(await r.settlementWork(parent.id, account.id)).toEqual({
      openChildRuns: 1,
      pendingSteers: 0,
      queuedResults: 1,
      spills: false,
    });
    expect(await r.settlementWork(a.child.id, account.id)).toEqual({
      openChildRuns: 0,
      pendingSteers: 1,
      queuedResults: 0,
      spills: false,
    });
    // a spilled result of the session's own (not another session's) is seen
    await r.recordSpill({
      sessionId: a.child.id,
      principalAccountId: account.id,
      path: `/spill/${randomUUID()}.txt`,
      byteSize: 10,
      sha256: "ab".repeat(32),
    });
    expect((await r.settlementWork(a.child.id, account.id)).spills).toBe(true);
    expect((await r.settlementWork(parent.id, account.id)).spills).toBe(false);
  });
});

describe("a run's lifetime: started, settling, settled", () => {
  it("markRunStarted and markRunSettling move only an open run of their generation", async () => {
    const { r, account, parent } = await root();
    const { run } = await r.createDelegation(delegation(parent.id, account.id));
    expect(await r.markRunSettling(run.id, run.generation)).toBe(false);
    expect(await r.markRunStarted(run.id, run.generation + 1, "o")).toBe(false);
    expect((await r.getRun(run.id, account.id)).status).toBe("queued");
    expect(await r.markRunStarted(run.id, run.generation, "o")).toBe(true);
    const started = await r.getRun(run.id, account.id);
    expect(started.status).toBe("running");
    expect(started.startedAt).toBeInstanceOf(Date);
    expect(await r.markRunSettling(run.id, run.generation + 1)).toBe(false);
    expect(await r.markRunSettling(run.id, run.generation)).toBe(true);
    expect(await r.markRunSettling(run.id, run.generation)).toBe(true);
    expect((await r.getRun(run.id, account.id)).status).toBe("settling");
    // settling does not go back to running through markRunStarted
    expect(await r.markRunStarted(run.id, run.generation, "o")).toBe(false);
    await r.settleRun({
      runId: run.id,
      generation: run.generation,
      resultId: randomUUID(),
      outcome: "ok",
      body: "",
      byteSize: 0,
    });
    expect(await r.markRunSettling(run.id, run.generation)).toBe(false);
  });

  it("startRun of an unknown run is not_found; of a settled one it does not start and returns the row", async () => {
    const { r, account, parent } = await root();
    const missing = randomUUID();
    await expect(r.startRun(missing, 1, "o")).rejects.toMatchObject({
      code: "not_found",
      message: "run not found",
      context: { runId: missing },
    });
    const { run } = await r.createDelegation(delegation(parent.id, account.id));
    await r.settleRun({
      runId: run.id,
      generation: 1,
      resultId: randomUUID(),
      outcome: "ok",
      body: "",
      byteSize: 0,
    });
    const out = await r.startRun(run.id, 1, "o");
    expect(out).toEqual({
      started: false,
      appended: false,
      run: expect.objectContaining({ id: run.id, status: "succeeded" }),
    });
  });

  it("a settling run starts again as running, journals nothing and takes the new owner's lease", async () => {
    const { r, account, parent } = await root();
    const { run, child } = await r.createDelegation(delegation(parent.id, account.id));
    await r.startRun(run.id, 1, "first");
    await r.markRunSettling(run.id, 1);
    const out = await r.startRun(run.id, 1, "second", child.id);
    expect(out).toMatchObject({
      started: true,
      appended: false,
      run: { status: "running" },
      child: { id: child.id },
    });
    expect(await r.readJournal(child.id, account.id)).toHaveLength(1);
    const { rows } = await db.pool.query("select locked_by from subagent_runs where id = $1", [run.id]);
    expect(rows[0]?.locked_by).toBe("second");
  });

  it("a private child's run starts without the child's row: readers do not see the child yet", async () => {
    const { r, account, parent } = await root();
    const fork = await r.createDelegation(
      delegation(parent.id, account.id, { fork: { fromSessionId: parent.id } }),
    );
    const out = await r.startRun(fork.run.id, 1, "o", fork.child.id);
    expect(out.started).toBe(true);
    expect(out.appended).toBe(true);
    expect("child" in out).toBe(false);
  });

  it("the task's journal wake is sent when someone may watch the child, and not when nobody does", async () => {
    const listener = new pg.Client({ connectionString: db.url });
    await listener.connect();
    const heard: string[] = [];
    listener.on("notification", (n) => {
      if (n.channel === JOURNAL_WAKE_CHANNEL && n.payload) heard.push(n.payload);
    });
    await listener.query(`listen ${JOURNAL_WAKE_CHANNEL}`);
    const { r, account, parent } = await root();
    const watched = new Set<string>();
    const remove = addWakeFilter((kind, id) => kind === "journal" && watched.has(id));
    try {
      const quiet = await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "quiet" }));
      const seen = await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "seen" }));
      const blind = await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "blind" }));
      watched.add(seen.child.id);
      expect((await r.startRun(quiet.run.id, 1, "o", quiet.child.id)).appended).toBe(true);
      expect((await r.startRun(seen.run.id, 1, "o", seen.child.id)).appended).toBe(true);
      // a caller that does not name the child cannot ask who watches it: the wake is sent
      expect((await r.startRun(blind.run.id, 1, "o")).appended).toBe(true);
      await expect.poll(() => heard.length).toBe(2);
      // a round trip on the listener's connection: anything sent before it has arrived
      await listener.query("select 1");
      expect([...heard].sort()).toEqual([`${seen.child.id}:1`, `${blind.child.id}:1`].sort());
    } finally {
      remove();
      await listener.end();
    }
  });

  it("a result entering a parent's inbox wakes its takers when someone may watch that inbox, once, and not when nobody does", async () => {
    const listener = new pg.Client({ connectionString: db.url });
    await listener.connect();
    const heard: string[] = [];
    listener.on("notification", (n) => {
      if (n.channel === INBOX_WAKE_CHANNEL && n.payload) heard.push(n.payload);
    });
    await listener.query(`listen ${INBOX_WAKE_CHANNEL}`);
    const quietRoot = await root();
    const seenRoot = await root();
    const blindRoot = await root();
    const watched = new Set<string>([seenRoot.parent.id]);
    const remove = addWakeFilter((kind, id) => kind === "inbox" && watched.has(id));
    const settle = async (
      { r, account, parent }: Awaited<ReturnType<typeof root>>,
      named: boolean,
      toolCallId = "call",
    ) => {
      const { run } = await r.createDelegation(delegation(parent.id, account.id, { toolCallId }));
      const result = {
        runId: run.id,
        generation: 1,
        resultId: randomUUID(),
        outcome: "ok" as const,
        body: "done",
        byteSize: 4,
        ...(named && { parentSessionId: parent.id }),
      };
      expect((await r.settleRun(result)).settled).toBe(true);
      // settled already: nothing enters the inbox, nothing wakes
      expect((await r.settleRun({ ...result, resultId: randomUUID() })).settled).toBe(false);
    };
    try {
      await settle(quietRoot, true);
      await settle(seenRoot, true);
      // a caller that does not name the parent cannot ask who watches it: the wake is sent
      await settle(blindRoot, false);
      // a workflow's summary wakes the same way
      const summary = (parent: string, account: string, toolCallId: string) => ({
        resultId: randomUUID(),
        parentSessionId: parent,
        principalAccountId: account,
        toolCallId,
        outcome: "ok" as const,
        body: "summary",
        byteSize: 7,
      });
      const { r } = quietRoot;
      await r.enqueueWorkflowSummary(summary(quietRoot.parent.id, quietRoot.account.id, "wf"));
      await r.enqueueWorkflowSummary(summary(seenRoot.parent.id, seenRoot.account.id, "wf"));
      // the same summary again is no new result: no wake
      await r.enqueueWorkflowSummary(summary(seenRoot.parent.id, seenRoot.account.id, "wf"));
      await expect.poll(() => heard.length).toBe(3);
      // a round trip on the listener's connection: anything sent before it has arrived
      await listener.query("select 1");
      expect([...heard].sort()).toEqual([seenRoot.parent.id, blindRoot.parent.id, seenRoot.parent.id].sort());
    } finally {
      remove();
      await listener.end();
    }
  });

  it("a settled result is the run's once: its status, error and spill are stored with it", async () => {
    const { r, account, parent } = await root();
    const { run, child } = await r.createDelegation(delegation(parent.id, account.id));
    const spill = await r.recordSpill({
      sessionId: child.id,
      principalAccountId: account.id,
      path: `/spill/${randomUUID()}`,
      byteSize: 5,
      sha256: "f".repeat(64),
    });
    const resultId = randomUUID();
    const out = await r.settleRun({
      runId: run.id,
      generation: 1,
      resultId,
      outcome: "error",
      body: "it broke",
      byteSize: 8,
      spillId: spill.id,
      error: { code: "boom", message: "it broke" },
    });
    expect(out).toEqual({ settled: true, resultId });
    const settled = await r.getRun(run.id, account.id);
    expect(settled).toMatchObject({ status: "failed", error: { code: "boom", message: "it broke" } });
    expect(settled.settledAt).toBeInstanceOf(Date);
    expect(await r.getResult(resultId, account.id)).toMatchObject({
      outcome: "error",
      spillPath: spill.path,
      body: "it broke",
    });
    const { rows } = await db.pool.query("select locked_by from subagent_runs where id = $1", [run.id]);
    expect(rows[0]?.locked_by).toBeNull();
    // an ok outcome succeeds, with no error
    const ok = await r.createDelegation(delegation(parent.id, account.id, { toolCallId: "ok" }));
    await r.settleRun({
      runId: ok.run.id,
      generation: 1,
      resultId: randomUUID(),
      outcome: "ok",
      body: "",
      byteSize: 0,
    });
    expect(await r.getRun(ok.run.id, account.id)).toMatchObject({ status: "succeeded", error: null });
  });

  it("settlers racing on one run store one result; every one of them is told that result's id", async () => {
    const { r, account, parent } = await root();
    const { run } = await r.createDelegation(delegation(parent.id, account.id));
    const outs = await Promise.all(
      Array.from({ length: 6 }, () =>
        r.settleRun({
          runId: run.id,
          generation: 1,
          resultId: randomUUID(),
          outcome: "ok",
          body: "",
          byteSize: 0,
        }),
      ),
    );
    const stored = await resultsOf(run.id);
    expect(stored).toHaveLength(1);
    expect(outs.filter((o) => o.settled)).toHaveLength(1);
    for (const o of outs) expect(o.resultId).toBe(stored[0]);
  });

  it("a stale generation, or a run ended without a result, refuses the settlement as stale_generation", async () => {
    const { r, account, parent } = await root();
    const { run } = await r.createDelegation(delegation(parent.id, account.id));
    await r.nextGenerations([{ runId: run.id, generation: 1, charged: true }]);
    const stale = {
      runId: run.id,
      generation: 1,
      resultId: randomUUID(),
      outcome: "ok" as const,
      body: "",
      byteSize: 0,
    };
    await expect(r.settleRun(stale)).rejects.toMatchObject({
      code: "stale_generation",
      message: "the run moved on before this settlement",
      context: { runId: run.id, generation: 1, current: 2, status: "queued" },
    });
    await db.pool.query("update subagent_runs set status = 'aborted' where id = $1", [run.id]);
    await expect(r.settleRun({ ...stale, generation: 2 })).rejects.toMatchObject({
      code: "stale_generation",
      context: { current: 2, status: "aborted" },
    });
    expect(await resultsOf(run.id)).toEqual([]);
    const missing = randomUUID();
    await expect(r.settleRun({ ...stale, runId: missing })).rejects.toMatchObject({
      code: "not_found",
      message: "run not found",
      context: { runId: missing },
    });
  });

  it("with a probe, the settlement is one transaction: a failure at its probe leaves no result and the run open", async () => {
    const { r, account, parent } = await root();
    const { run } = await r.createDelegation(delegation(parent.id, account.id));
    const points: string[] = [];
    const settlement = {
      runId: run.id,
      generation: 1,
      resultId: randomUUID(),
      outcome: "ok" as const,
      body: "",
      byteSize: 0,
    };
    await expect(
      r.settleRun(settlement, {
        probe: (point) => {
          points.push(point);
          throw new Error("crash before commit");
        },
      }),
    ).rejects.toThrow("crash before commit");
    expect(points).toEqual(["settle.before_commit"]);
    expect(await resultsOf(run.id)).toEqual([]);
    expect((await r.getRun(run.id, account.id)).status).toBe("queued");
    // the retry settles; a second one with a probe finds the result and does not reach the probe
    expect(await r.settleRun(settlement, { probe: (p) => points.push(p) })).toEqual({
      settled: true,
      resultId: settlement.resultId,
    });
    expect(
      await r.settleRun({ ...settlement, resultId: randomUUID() }, { probe: (p) => points.push(p) }),
    ).toEqual({
      settled: false,
      resultId: settlement.resultId,
    });
    expect(points).toEqual(["settle.before_commit", "settle.before_commit"]);
  });
});

describe("progress and Ctrl+B", () => {
  it("the first snapshot may have seq 1; a fraction or a seq below 1 is invalid_input", async () => {
    const { r, account, parent } = await root();
    const { run } = await r.createDelegation(delegation(parent.id, account.id));
    expect(await r.recordRunProgress(run.id, account.id, 1, 1, '{"p":1}')).toBe(true);
    expect((await r.getRun(run.id, account.id)).progress).toBe('{"p":1}');
    for (const seq of [0, -1, 1.5]) {
      await expect(r.recordRunProgress(run.id, account.id, 1, seq, "{}")).rejects.toMatchObject({
        code: "invalid_input",
        message: "a progress snapshot's seq is a positive integer",
        context: { runId: run.id },
      });
    }
  });

  it("Ctrl+B moves only an open row of this generation and this account", async () => {
    const { r, account, parent } = await root();
    const { run } = await r.createDelegation(delegation(parent.id, account.id, { mode: "foreground" }));
    const stranger = await r.createAccount({ name: `cb-${randomUUID().slice(0, 8)}` });
    expect(await r.moveRunToBackground(run.id, stranger.id, 1)).toBe(false);
    expect(await r.moveRunToBackground(run.id, account.id, 2)).toBe(false);
    expect((await r.getRun(run.id, account.id)).mode).toBe("foreground");
    expect(await r.moveRunToBackground(run.id, account.id, 1)).toBe(true);
    expect((await r.getRun(run.id, account.id)).mode).toBe("background");
  });
});
