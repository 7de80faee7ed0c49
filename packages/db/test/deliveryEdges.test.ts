import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { PgDelegationRepository, type QueuedResult, type TranscriptMessage } from "../src/index.js";
import { asMessage, inbox as inboxOf } from "./support/family.js";

const db = useTestDatabase();

const inbox = (n: number) => inboxOf(db.pool, n, "de");

const acks = async (sessionId: string) =>
  (
    await db.pool.query<{ result_id: string }>(
      "select result_id from delegation_result_acks where parent_session_id = $1 order by journal_seq",
      [sessionId],
    )
  ).rows.map((row) => row.result_id);

describe("delivery: what is delivered once, what is skipped, what is refused", () => {
  it("ids already delivered or not in this inbox are skipped in the caller's order; the rest are delivered in queue order", async () => {
    const { r, account, parent, ids } = await inbox(4);
    const [a, b, c, d] = ids as [string, string, string, string];
    await r.deliverResults(parent.id, account.id, [a], asMessage);
    const elsewhere = await inbox(1);
    const foreign = elsewhere.ids[0] as string;
    const out = await r.deliverResults(parent.id, account.id, [d, a, foreign, b], asMessage);
    expect(out.delivered.map((x) => x.resultId)).toEqual([b, d]);
    expect(out.skipped).toEqual([a, foreign]);
    // the foreign result is still waiting in its own inbox, c in this one
    expect(await r.queuedResultIds(elsewhere.parent.id, elsewhere.account.id)).toEqual([foreign]);
    expect(await r.queuedResultIds(parent.id, account.id)).toEqual([c]);
    expect(await acks(parent.id)).toEqual([a, b, d]);
  });

  it("each delivered result names the journal row it was written to, its tool call and its kind", async () => {
    const { r, account, parent, ids } = await inbox(2);
    const out = await r.deliverQueuedResults(parent.id, account.id, asMessage);
    const journal = await r.readJournal(parent.id, account.id);
    expect(out.delivered).toEqual([
      { resultId: ids[0], journalSeq: journal[0]?.seq, toolCallId: "call-0", kind: "subagent" },
      { resultId: ids[1], journalSeq: journal[1]?.seq, toolCallId: "call-1", kind: "subagent" },
    ]);
    expect(out.results.map((q) => q.id)).toEqual(ids);
  });

  it("a delivery with nothing pending writes no journal row and never reaches its probe", async () => {
    const { r, account, parent, ids } = await inbox(1);
    await r.deliverResults(parent.id, account.id, ids, asMessage);
    const points: string[] = [];
    const probe = (point: string) => {
      points.push(point);
      throw new Error("the probe ran");
    };
    const again = await r.deliverResults(parent.id, account.id, ids, asMessage, { probe });
    expect(again).toEqual({ delivered: [], skipped: ids });
    const queued = await r.deliverQueuedResults(parent.id, account.id, asMessage, { probe });
    expect(queued).toEqual({ delivered: [], results: [] });
    expect(points).toEqual([]);
    expect(await r.readJournal(parent.id, account.id)).toHaveLength(1);
  });

  it("the probe runs between the journal rows and the acknowledgements, once per delivery, by its name", async () => {
    const { r, account, parent, ids } = await inbox(2);
    const seen: string[] = [];
    const out = await r.deliverResults(parent.id, account.id, ids, asMessage, {
      probe: (point) => seen.push(point),
    });
    expect(out.delivered).toHaveLength(2);
    expect(seen).toEqual(["delivery.between_append_and_ack"]);
  });

  it("an empty list of ids delivers nothing without looking at the session, even one that does not exist", async () => {
    const r = new PgDelegationRepository(db.pool);
    const account = await r.createAccount({ name: `empty-${randomUUID().slice(0, 8)}` });
    await expect(r.deliverResults(randomUUID(), account.id, [], asMessage)).resolves.toEqual({
      delivered: [],
      skipped: [],
    });
  });

  it("a delivery to a session of another account, or one that does not exist, is not_found and writes nothing", async () => {
    const { r, parent, ids } = await inbox(1);
    const intruder = await r.createAccount({ name: `intr-${randomUUID().slice(0, 8)}` });
    await expect(r.deliverResults(parent.id, intruder.id, ids, asMessage)).rejects.toMatchObject({
      code: "not_found",
      message: "session not found",
      context: { sessionId: parent.id },
    });
    const missing = randomUUID();
    await expect(r.deliverQueuedResults(missing, intruder.id, asMessage)).rejects.toMatchObject({
      code: "not_found",
      message: "session not found",
      context: { sessionId: missing },
    });
    expect(await acks(parent.id)).toEqual([]);
  });

  it("malformed ids are refused naming the argument: session, result, run", async () => {
    const r = new PgDelegationRepository(db.pool);
    const account = await r.createAccount({ name: `bad-${randomUUID().slice(0, 8)}` });
    const bad = "not-a-uuid";
    const refusal = (what: string) => ({
      code: "invalid_input",
      message: `${what} is not a uuid`,
      context: { [what]: bad },
    });
    await expect(r.queuedResults(bad, account.id)).rejects.toMatchObject(refusal("sessionId"));
    await expect(r.deliverResults(bad, account.id, [], asMessage)).rejects.toMatchObject(
      refusal("sessionId"),
    );
    await expect(r.deliverResults(randomUUID(), account.id, [bad], asMessage)).rejects.toMatchObject(
      refusal("resultId"),
    );
    await expect(r.deliverQueuedResults(bad, account.id, asMessage)).rejects.toMatchObject(
      refusal("sessionId"),
    );
    await expect(r.getResult(bad, account.id)).rejects.toMatchObject(refusal("resultId"));
    await expect(r.resultForRun(bad, account.id)).rejects.toMatchObject(refusal("runId"));
  });

  it("a foreground result delivered as the tool call's toolResult message is journaled and acknowledged", async () => {
    const { r, account, parent, ids } = await inbox(1);
    const id = ids[0] as string;
    const out = await r.deliverResults(parent.id, account.id, ids, (q) => ({
      role: "toolResult",
      toolCallId: q.toolCallId,
      toolName: "Delegate",
      content: q.body,
      isError: false,
      details: { resultId: q.id },
    }));
    expect(out.delivered.map((x) => x.resultId)).toEqual([id]);
    const journal = await r.readJournal(parent.id, account.id);
    expect(journal[0]?.body).toMatchObject({
      type: "message",
      message: { role: "toolResult", toolCallId: "call-0", details: { resultId: id } },
    });
    expect(await acks(parent.id)).toEqual([id]);
  });

  it("a message that does not carry its result's id is refused as invalid_input, and nothing is journaled or acknowledged", async () => {
    const { r, account, parent, ids } = await inbox(2);
    const [a, b] = ids as [string, string];
    const wrong: Array<[string, (q: QueuedResult) => TranscriptMessage]> = [
      // another result's id
      ["another id", (q) => ({ ...asMessage(q), details: { resultId: q.id === a ? b : a } })],
      // no details at all
      ["no details", (q) => ({ role: "custom", customType: "delegation_result", content: q.body })],
      // a user message never carries a delivery, whatever extra fields it is given
      [
        "user message",
        (q) =>
          ({ role: "user", content: q.body, details: { resultId: q.id } }) as unknown as TranscriptMessage,
      ],
    ];
    for (const [, message] of wrong) {
      await expect(r.deliverResults(parent.id, account.id, ids, message)).rejects.toMatchObject({
        code: "invalid_input",
        message: "a delivered message must carry its details.resultId",
        context: { resultId: a },
      });
      await expect(r.deliverQueuedResults(parent.id, account.id, message)).rejects.toMatchObject({
        code: "invalid_input",
      });
    }
    expect(await r.readJournal(parent.id, account.id)).toEqual([]);
    expect(await acks(parent.id)).toEqual([]);
    expect(await r.queuedResultIds(parent.id, account.id)).toEqual(ids);
  });
});

describe("reading one result", () => {
  it("getResult and resultForRun read the result with its spill path, for its own account only", async () => {
    const r = new PgDelegationRepository(db.pool);
    const account = await r.createAccount({ name: `get-${randomUUID().slice(0, 8)}` });
    const parent = await r.createRootSession(account.id, "scripted");
    const { run, child } = await r.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "spilled-call",
      task: "big output",
      mode: "foreground",
      model: "scripted",
      scope: "{}",
    });
    expect(await r.resultForRun(run.id, account.id)).toBeNull();
    const spill = await r.recordSpill({
      sessionId: child.id,
      principalAccountId: account.id,
      path: `/spill/${randomUUID()}.txt`,
      byteSize: 9000,
      sha256: "ab".repeat(32),
    });
    const resultId = randomUUID();
    await r.settleRun({
      runId: run.id,
      generation: run.generation,
      resultId,
      outcome: "error",
      body: "see spill",
      byteSize: 9000,
      spillId: spill.id,
    });
    const expected = {
      id: resultId,
      parentSessionId: parent.id,
      childSessionId: child.id,
      runId: run.id,
      toolCallId: "spilled-call",
      kind: "subagent",
      outcome: "error",
      mode: "foreground",
      body: "see spill",
      byteSize: 9000,
      spillPath: spill.path,
    };
    expect(await r.getResult(resultId, account.id)).toMatchObject(expected);
    expect(await r.resultForRun(run.id, account.id)).toMatchObject(expected);
    const other = await r.createAccount({ name: `oth-${randomUUID().slice(0, 8)}` });
    await expect(r.getResult(resultId, other.id)).rejects.toMatchObject({
      code: "not_found",
      message: "result not found",
      context: { resultId },
    });
    expect(await r.resultForRun(run.id, other.id)).toBeNull();
  });

  it("queuedResults returns at most its limit, oldest first", async () => {
    const { r, account, parent, ids } = await inbox(3);
    expect((await r.queuedResults(parent.id, account.id, 2)).map((q) => q.id)).toEqual(ids.slice(0, 2));
    expect((await r.queuedResults(parent.id, account.id)).map((q) => q.id)).toEqual(ids);
  });
});

describe("a workflow's summary enters the inbox once per tool call", () => {
  it("the same tool call again returns the first summary's id and creates nothing", async () => {
    const r = new PgDelegationRepository(db.pool);
    const account = await r.createAccount({ name: `wf-${randomUUID().slice(0, 8)}` });
    const parent = await r.createRootSession(account.id, "scripted");
    const spill = await r.recordSpill({
      sessionId: parent.id,
      principalAccountId: account.id,
      path: `/spill/${randomUUID()}.txt`,
      byteSize: 50_000,
      sha256: "cd".repeat(32),
    });
    const first = randomUUID();
    const summary = {
      resultId: first,
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "wf-call",
      outcome: "ok" as const,
      body: "summary",
      byteSize: 50_000,
      spillId: spill.id,
    };
    expect(await r.enqueueWorkflowSummary(summary)).toEqual({ resultId: first, created: true });
    expect(await r.enqueueWorkflowSummary({ ...summary, resultId: randomUUID(), body: "again" })).toEqual({
      resultId: first,
      created: false,
    });
    const queued = await r.queuedResults(parent.id, account.id);
    expect(queued).toHaveLength(1);
    expect(queued[0]).toMatchObject({
      id: first,
      kind: "workflow_summary",
      mode: "background",
      outcome: "ok",
      body: "summary",
      toolCallId: "wf-call",
      runId: null,
      childSessionId: null,
      spillPath: spill.path,
    });
    // another tool call is another summary, with no spill
    const second = randomUUID();
    const { spillId: _none, ...unspilled } = summary;
    expect(
      await r.enqueueWorkflowSummary({
        ...unspilled,
        resultId: second,
        toolCallId: "wf-call-2",
        outcome: "error",
      }),
    ).toEqual({ resultId: second, created: true });
    const both = await r.queuedResults(parent.id, account.id);
    expect(both.map((q) => [q.id, q.outcome, q.spillPath])).toEqual([
      [first, "ok", spill.path],
      [second, "error", null],
    ]);
  });

  it("a summary for a session of another account or with malformed ids is refused and stores nothing", async () => {
    const r = new PgDelegationRepository(db.pool);
    const account = await r.createAccount({ name: `wf2-${randomUUID().slice(0, 8)}` });
    const parent = await r.createRootSession(account.id, "scripted");
    const other = await r.createAccount({ name: `wf3-${randomUUID().slice(0, 8)}` });
    const summary = {
      resultId: randomUUID(),
      parentSessionId: parent.id,
      principalAccountId: other.id,
      toolCallId: "wf-x",
      outcome: "ok" as const,
      body: "s",
      byteSize: 1,
    };
    await expect(r.enqueueWorkflowSummary(summary)).rejects.toMatchObject({
      code: "not_found",
      context: { sessionId: parent.id },
    });
    await expect(r.enqueueWorkflowSummary({ ...summary, resultId: "nope" })).rejects.toMatchObject({
      code: "invalid_input",
      message: "resultId is not a uuid",
    });
    await expect(r.enqueueWorkflowSummary({ ...summary, parentSessionId: "nope" })).rejects.toMatchObject({
      code: "invalid_input",
      message: "parentSessionId is not a uuid",
    });
    expect(await r.queuedResults(parent.id, account.id)).toEqual([]);
  });
});
