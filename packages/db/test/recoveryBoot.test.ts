import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { PgDelegationRepository, type QueuedResult, type TranscriptMessage } from "../src/index.js";

const db = useTestDatabase();
const repo = () => new PgDelegationRepository(db.pool);

const asMessage = (q: QueuedResult): TranscriptMessage => ({
  role: "custom",
  customType: "delegation_result",
  content: q.body,
  details: { resultId: q.id },
});

async function root() {
  const r = repo();
  const account = await r.createAccount({ name: `rb-${randomUUID().slice(0, 8)}` });
  const parent = await r.createRootSession(account.id, "scripted");
  return { r, account, parent };
}

type Repo = PgDelegationRepository;
const delegate = (
  r: Repo,
  parentSessionId: string,
  principalAccountId: string,
  toolCallId: string,
  fork = false,
) =>
  r.createDelegation({
    parentSessionId,
    principalAccountId,
    toolCallId,
    task: "t",
    mode: "background",
    model: "scripted",
    scope: "{}",
    ...(fork ? { fork: { fromSessionId: parentSessionId } } : {}),
  });

const count = async (sql: string, ids: string[]) =>
  Number((await db.pool.query<{ n: string }>(sql, [ids])).rows[0]?.n);

describe("boot: private fork copies", () => {
  it("an unfinished fork copy goes with its own children, their journals, runs, results, acks, steers and spills; the rest stays", async () => {
    const { r, account, parent } = await root();
    const kept = await delegate(r, parent.id, account.id, "visible-child");
    // the fork copy's subtree is built while visible (a private session takes no delegation), then made
    // private as an unfinished copy is: a journal row, a helper with a delivered result, a grandchild with a
    // queued one, a steer to the helper, a spill
    const fork = await delegate(r, parent.id, account.id, "fork");
    await r.append(fork.child.id, account.id, [
      { body: { type: "message", message: { role: "user", content: "copied" } } },
    ]);
    const helper = await delegate(r, fork.child.id, account.id, "helper");
    const grandchild = await delegate(r, helper.child.id, account.id, "grandchild");
    await r.settleRun({
      runId: grandchild.run.id,
      generation: 1,
      resultId: randomUUID(),
      outcome: "ok",
      body: "g",
      byteSize: 1,
    });
    const helperResult = randomUUID();
    await r.settleRun({
      runId: helper.run.id,
      generation: 1,
      resultId: helperResult,
      outcome: "ok",
      body: "h",
      byteSize: 1,
    });
    await r.deliverResults(fork.child.id, account.id, [helperResult], asMessage);
    await db.pool.query(
      "insert into delegated_steers (child_session_id, principal_account_id, text) values ($1, $2, 'steer')",
      [helper.child.id, account.id],
    );
    await r.recordSpill({
      sessionId: helper.child.id,
      principalAccountId: account.id,
      path: `/spill/${randomUUID()}`,
      byteSize: 1,
      sha256: "ef".repeat(32),
    });
    await db.pool.query("update sessions set visibility = 'private' where id = $1", [fork.child.id]);

    const discarded = await r.discardPrivateSessions();
    const doomed = [fork.child.id, helper.child.id, grandchild.child.id];
    expect([...discarded].sort()).toEqual([...doomed].sort());
    expect(await count("select count(*) as n from sessions where id = any($1::uuid[])", doomed)).toBe(0);
    expect(
      await count("select count(*) as n from journal_entries where session_id = any($1::uuid[])", doomed),
    ).toBe(0);
    expect(
      await count(
        "select count(*) as n from subagent_runs where parent_session_id = any($1::uuid[]) or child_session_id = any($1::uuid[])",
        doomed,
      ),
    ).toBe(0);
    expect(
      await count(
        "select count(*) as n from delegation_result_acks where parent_session_id = any($1::uuid[])",
        doomed,
      ),
    ).toBe(0);
    expect(
      await count(
        "select count(*) as n from delegation_results where parent_session_id = any($1::uuid[]) or child_session_id = any($1::uuid[])",
        doomed,
      ),
    ).toBe(0);
    expect(
      await count(
        "select count(*) as n from delegated_steers where child_session_id = any($1::uuid[])",
        doomed,
      ),
    ).toBe(0);
    expect(
      await count("select count(*) as n from spilled_outputs where session_id = any($1::uuid[])", doomed),
    ).toBe(0);
    // the visible parent, its visible child and both calls' rows stay; the fork's call has no child now
    expect((await r.getSession(kept.child.id, account.id)).id).toBe(kept.child.id);
    expect((await r.getRun(kept.run.id, account.id)).childSessionId).toBe(kept.child.id);
    expect((await r.getRun(fork.run.id, account.id)).childSessionId).toBeNull();
    // nothing private is left: a second boot discards nothing
    expect(await r.discardPrivateSessions()).toEqual([]);
  });
});

describe("boot: sessions to repair and inboxes to deliver", () => {
  it("a session with a tool intent and no tool result is dangling; a result, a discarded intent or a private session is not", async () => {
    const { r, account, parent } = await root();
    const intent = (toolCallId: string) => ({
      body: { type: "tool_intent" as const, toolCallId, toolName: "Bash", arguments: {} },
    });
    const answered = await r.createRootSession(account.id, "scripted");
    await r.append(answered.id, account.id, [
      intent("t1"),
      {
        body: {
          type: "message",
          message: { role: "toolResult", toolCallId: "t1", toolName: "Bash", content: "ok", isError: false },
        },
      },
    ]);
    const discarded = await r.createRootSession(account.id, "scripted");
    await r.append(discarded.id, account.id, [{ ...intent("t2"), settled: false }]);
    await r.settleProvisional(discarded.id, account.id, "discarded");
    const fork = await delegate(r, parent.id, account.id, "private", true);
    await r.append(fork.child.id, account.id, [intent("t3")]);
    await r.append(parent.id, account.id, [intent("t4")]);

    const all = await r.sessionsWithDanglingToolCalls();
    expect(all).toContainEqual({ sessionId: parent.id, principalAccountId: account.id });
    const ids = all.map((s) => s.sessionId);
    for (const not of [answered.id, discarded.id, fork.child.id]) expect(ids).not.toContain(not);
    // a live takeover asks about some sessions only
    expect(await r.sessionsWithDanglingToolCalls([answered.id])).toEqual([]);
    expect(await r.sessionsWithDanglingToolCalls([parent.id, answered.id])).toEqual([
      { sessionId: parent.id, principalAccountId: account.id },
    ]);
    await expect(r.sessionsWithDanglingToolCalls(["bad"])).rejects.toMatchObject({
      code: "invalid_input",
      context: { sessionId: "bad" },
    });
  });

  it("the inboxes to deliver at boot are the visible sessions with an unacknowledged result, with their kind", async () => {
    const { r, account, parent } = await root();
    const d = await delegate(r, parent.id, account.id, "c1");
    const helper = await delegate(r, d.child.id, account.id, "c2");
    const toRoot = randomUUID();
    await r.settleRun({
      runId: d.run.id,
      generation: 1,
      resultId: toRoot,
      outcome: "ok",
      body: "x",
      byteSize: 1,
    });
    await r.settleRun({
      runId: helper.run.id,
      generation: 1,
      resultId: randomUUID(),
      outcome: "ok",
      body: "y",
      byteSize: 1,
    });
    const mine = async () =>
      (await r.sessionsWithQueuedResults()).filter((s) => s.principalAccountId === account.id);
    expect(await mine()).toHaveLength(2);
    expect(await mine()).toContainEqual({
      sessionId: parent.id,
      principalAccountId: account.id,
      kind: "root",
    });
    expect(await mine()).toContainEqual({
      sessionId: d.child.id,
      principalAccountId: account.id,
      kind: "delegated",
    });
    await r.deliverResults(parent.id, account.id, [toRoot], asMessage);
    expect(await mine()).toEqual([
      { sessionId: d.child.id, principalAccountId: account.id, kind: "delegated" },
    ]);
  });
});

describe("spilled outputs", () => {
  it("a spill is recorded once per path; the same path again updates its size and hash for the same session only", async () => {
    const { r, account, parent } = await root();
    const path = `/spill/${randomUUID()}.txt`;
    const first = await r.recordSpill({
      sessionId: parent.id,
      principalAccountId: account.id,
      path,
      byteSize: 10,
      sha256: "a".repeat(64),
    });
    expect(first).toEqual({ id: first.id, sessionId: parent.id, path, byteSize: 10, sha256: "a".repeat(64) });
    const again = await r.recordSpill({
      sessionId: parent.id,
      principalAccountId: account.id,
      path,
      byteSize: 20,
      sha256: "b".repeat(64),
    });
    expect(again.id).toBe(first.id);
    expect(await r.spilledOutput(parent.id, account.id, path)).toEqual({
      id: first.id,
      sessionId: parent.id,
      path,
      byteSize: 20,
      sha256: "b".repeat(64),
    });
    // another session cannot take the path over: a typed conflict, and the first record stays
    const other = await r.createRootSession(account.id, "scripted");
    await expect(
      r.recordSpill({
        sessionId: other.id,
        principalAccountId: account.id,
        path,
        byteSize: 1,
        sha256: "c".repeat(64),
      }),
    ).rejects.toMatchObject({ code: "conflict", context: { sessionId: other.id, path } });
    expect((await r.spilledOutput(parent.id, account.id, path))?.byteSize).toBe(20);
    expect(await r.spilledOutput(other.id, account.id, path)).toBeNull();
    const stranger = await r.createAccount({ name: `st-${randomUUID().slice(0, 8)}` });
    expect(await r.spilledOutput(parent.id, stranger.id, path)).toBeNull();
    expect(await r.spilledOutput(parent.id, account.id, "/spill/none")).toBeNull();
    await expect(r.spilledOutput("bad", account.id, path)).rejects.toMatchObject({
      code: "invalid_input",
      context: { sessionId: "bad" },
    });
    await expect(r.spilledOutput(parent.id, "bad", path)).rejects.toMatchObject({
      code: "invalid_input",
      context: { principalAccountId: "bad" },
    });
    await expect(
      r.recordSpill({
        sessionId: "bad",
        principalAccountId: account.id,
        path: "/x",
        byteSize: 1,
        sha256: "d".repeat(64),
      }),
    ).rejects.toMatchObject({ code: "invalid_input", context: { sessionId: "bad" } });
  });

  it("a session with a spill or an open child call still has something on disk or running; one with neither has not", async () => {
    const { r, account, parent } = await root();
    expect(await r.hasSpillsOrOpenChildren(parent.id, account.id)).toBe(false);
    const d = await delegate(r, parent.id, account.id, "c");
    expect(await r.hasSpillsOrOpenChildren(parent.id, account.id)).toBe(true);
    await r.settleRun({
      runId: d.run.id,
      generation: 1,
      resultId: randomUUID(),
      outcome: "ok",
      body: "",
      byteSize: 0,
    });
    expect(await r.hasSpillsOrOpenChildren(parent.id, account.id)).toBe(false);
    await r.recordSpill({
      sessionId: parent.id,
      principalAccountId: account.id,
      path: `/spill/${randomUUID()}`,
      byteSize: 1,
      sha256: "e".repeat(64),
    });
    expect(await r.hasSpillsOrOpenChildren(parent.id, account.id)).toBe(true);
    const stranger = await r.createAccount({ name: `hs-${randomUUID().slice(0, 8)}` });
    expect(await r.hasSpillsOrOpenChildren(parent.id, stranger.id)).toBe(false);
    await expect(r.hasSpillsOrOpenChildren("bad", account.id)).rejects.toMatchObject({
      code: "invalid_input",
      context: { sessionId: "bad" },
    });
    await expect(r.hasSpillsOrOpenChildren(parent.id, "bad")).rejects.toMatchObject({
      code: "invalid_input",
      context: { principalAccountId: "bad" },
    });
  });
});

describe("a live takeover's discard of private copies", () => {
  it("discards only the private sessions among those named (with what is under them), none when none are named, and refuses a malformed id", async () => {
    const { r, account, parent } = await root();
    const mine = await delegate(r, parent.id, account.id, `mine-${randomUUID()}`, true);
    const others = await delegate(r, parent.id, account.id, `others-${randomUUID()}`, true);
    const visible = await delegate(r, parent.id, account.id, `visible-${randomUUID()}`);
    // a session under the copy (made while it was visible, then the copy is private again)
    await db.pool.query("update sessions set visibility = 'visible' where id = $1", [mine.child.id]);
    const under = await delegate(r, mine.child.id, account.id, `under-${randomUUID()}`);
    await db.pool.query("update sessions set visibility = 'private' where id = $1", [mine.child.id]);
    const privateOf = async (id: string) =>
      (await db.pool.query("select visibility from sessions where id = $1", [id])).rows[0]?.visibility;
    expect(await privateOf(mine.child.id)).toBe("private");
    expect(await privateOf(others.child.id)).toBe("private");

    expect(await r.discardPrivateSessions([])).toEqual([]);
    expect(await privateOf(others.child.id)).toBe("private");
    const discarded = await r.discardPrivateSessions([mine.child.id, visible.child.id]);
    expect([...discarded].sort()).toEqual([mine.child.id, under.child.id].sort());
    // another process's copy in progress, and a visible child named, stay
    expect(await privateOf(others.child.id)).toBe("private");
    expect(await privateOf(visible.child.id)).toBe("visible");
    expect((await r.getRun(mine.run.id, account.id)).childSessionId).toBeNull();
    await expect(r.discardPrivateSessions(["not-a-uuid"])).rejects.toThrow(/sessionId/);
  });
});
