import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { type JournalWrite, PgDelegationRepository } from "../src/index.js";

const db = useTestDatabase();

const answer = (text: string, settled = true): JournalWrite => ({
  body: {
    type: "message",
    message: { role: "assistant", content: [{ type: "text", text }], stopReason: "stop" },
  },
  settled,
});

/** A background call of `parentSessionId`, created (queued) and not started. */
const delegation = (
  r: PgDelegationRepository,
  parentSessionId: string,
  accountId: string,
  toolCallId: string,
) =>
  r.createDelegation({
    parentSessionId,
    principalAccountId: accountId,
    toolCallId,
    task: "the task",
    mode: "background",
    model: "scripted",
    scope: '{"s":1}',
  });

/** A root session's call, queued. */
async function queued() {
  const r = new PgDelegationRepository(db.pool);
  const account = await r.createAccount({ name: `cr-${randomUUID().slice(0, 8)}` });
  const parent = await r.createRootSession(account.id, "scripted");
  const { run, child } = await delegation(r, parent.id, account.id, "call-1");
  return { r, account, parent, run, child };
}

/** A root session's call, started. */
async function started() {
  const made = await queued();
  await made.r.startRun(made.run.id, made.run.generation, "owner", made.child.id);
  return made;
}

const statusOf = async (runId: string) =>
  (await db.pool.query("select status from subagent_runs where id = $1", [runId])).rows[0]?.status;

describe("a settling call's mark and reply in one statement", () => {
  it("marks the run settling and answers the child's newest settled assistant message", async () => {
    const { r, account, run, child } = await started();
    await r.append(child.id, account.id, [answer("first"), answer("second"), answer("streaming", false)]);
    const out = await r.markSettlingWithReply(run.id, run.generation, child.id, account.id);
    expect(out.marked).toBe(true);
    // the provisional row of a turn still streaming is not the reply
    expect(out.reply?.message).toMatchObject({ content: [{ type: "text", text: "second" }] });
    expect(await statusOf(run.id)).toBe("settling");
    // the same reply markRunSettling and recentAssistantMessages give one after the other
    const [recent] = await r.recentAssistantMessages(child.id, account.id, 1);
    expect(out.reply).toEqual(recent);
  });

  it("marks nothing for another generation or a settled run, and still reads the reply", async () => {
    const { r, account, run, child } = await started();
    await r.append(child.id, account.id, [answer("done")]);
    const stale = await r.markSettlingWithReply(run.id, run.generation + 1, child.id, account.id);
    expect(stale.marked).toBe(false);
    expect(await statusOf(run.id)).toBe("running");
    expect(stale.reply?.seq).toBeGreaterThan(0);
    await r.settleRun({
      runId: run.id,
      generation: run.generation,
      resultId: randomUUID(),
      outcome: "ok",
      body: "",
      byteSize: 0,
    });
    const late = await r.markSettlingWithReply(run.id, run.generation, child.id, account.id);
    expect(late.marked).toBe(false);
    expect(await statusOf(run.id)).toBe("succeeded");
  });

  it("answers no reply for a child without an assistant message, and not_found for another principal", async () => {
    const { r, account, run, child } = await started();
    expect(await r.markSettlingWithReply(run.id, run.generation, child.id, account.id)).toEqual({
      marked: true,
      reply: null,
    });
    const stranger = await r.createAccount({ name: `cr-x-${randomUUID().slice(0, 8)}` });
    await expect(
      r.markSettlingWithReply(run.id, run.generation, child.id, stranger.id),
    ).rejects.toMatchObject({ code: "not_found", context: { sessionId: child.id } });
    await expect(r.markSettlingWithReply("nope", run.generation, child.id, account.id)).rejects.toMatchObject(
      { code: "invalid_input" },
    );
  });
});

describe("the settlement's look: the child's inbox, and the settling mark once it is idle", () => {
  const whenIdle = { whenIdle: true };

  it("counts the child's inbox in the mark's own statement and marks nothing while a steer, a result or an open call of the child waits", async () => {
    const { r, account, run, child } = await started();
    await r.append(child.id, account.id, [answer("done")]);
    const steer = await r.enqueueSteer(child.id, account.id, "also this");
    const withSteer = await r.markSettlingWithReply(run.id, run.generation, child.id, account.id, whenIdle);
    expect(withSteer.marked).toBe(false);
    expect(withSteer.work).toEqual(await r.settlementWork(child.id, account.id));
    expect(withSteer.work?.pendingSteers).toBe(1);
    expect(withSteer.reply?.message).toMatchObject({ content: [{ type: "text", text: "done" }] });
    expect(await statusOf(run.id)).toBe("running");
    await r.deliverSteers(child.id, account.id, [steer.id]);

    // an open call of the child's own
    const { run: helper } = await delegation(r, child.id, account.id, "helper");
    const withHelper = await r.markSettlingWithReply(run.id, run.generation, child.id, account.id, whenIdle);
    expect(withHelper).toMatchObject({ marked: false, work: { openChildRuns: 1, queuedResults: 0 } });
    expect(await statusOf(run.id)).toBe("running");

    // the helper's result, settled and not yet taken by the child
    await r.startRun(helper.id, helper.generation, "owner");
    await r.settleRun({
      runId: helper.id,
      generation: helper.generation,
      resultId: randomUUID(),
      outcome: "ok",
      body: "helper done",
      byteSize: 11,
    });
    const withResult = await r.markSettlingWithReply(run.id, run.generation, child.id, account.id, whenIdle);
    expect(withResult).toMatchObject({ marked: false, work: { openChildRuns: 0, queuedResults: 1 } });
    expect(await statusOf(run.id)).toBe("running");
  });

  it("marks the run settling when the inbox is idle, with the reply and the counts of that snapshot", async () => {
    const { r, account, run, child } = await started();
    await r.append(child.id, account.id, [answer("done")]);
    const out = await r.markSettlingWithReply(run.id, run.generation, child.id, account.id, whenIdle);
    expect(out).toEqual({
      marked: true,
      reply: expect.objectContaining({ message: expect.objectContaining({ role: "assistant" }) }),
      work: { openChildRuns: 0, pendingSteers: 0, queuedResults: 0, spills: false },
    });
    expect(await statusOf(run.id)).toBe("settling");
    // without the option: no counts, the mark whatever waits
    expect(Object.keys(await r.markSettlingWithReply(run.id, run.generation, child.id, account.id))).toEqual([
      "marked",
      "reply",
    ]);
  });
});

describe("a call's start reads its child's inbox", () => {
  it("answers what settlementWork gives for the child, in the start's own statement", async () => {
    const { r, account, run, child } = await queued();
    await r.enqueueSteer(child.id, account.id, "one");
    await r.enqueueSteer(child.id, account.id, "two");
    await delegation(r, child.id, account.id, "helper");
    const start = await r.startRun(run.id, run.generation, "owner", child.id);
    expect(start.work).toEqual({ openChildRuns: 1, pendingSteers: 2, queuedResults: 0, spills: false });
    expect(start.work).toEqual(await r.settlementWork(child.id, account.id));
  });
});

describe("a session and its account's live grant in one snapshot", () => {
  it("answers what getSession and getAccount answer one after the other, a grant changed since included", async () => {
    const { r, account, parent } = await started();
    await db.pool.query("update accounts set tool_deny = array['Bash'] where id = $1", [account.id]);
    const both = await r.getSessionWithAccount(parent.id, account.id);
    expect(both.session).toEqual(await r.getSession(parent.id, account.id));
    expect(both.account).toEqual(await r.getAccount(account.id));
    expect(both.account.toolDeny).toEqual(["Bash"]);
  });

  it("is not_found for an unknown session, another principal's, and refuses an id that is not a uuid", async () => {
    const { r, account, parent } = await started();
    const stranger = await r.createAccount({ name: `cr-y-${randomUUID().slice(0, 8)}` });
    const missing = randomUUID();
    await expect(r.getSessionWithAccount(missing, account.id)).rejects.toMatchObject({
      code: "not_found",
      context: { sessionId: missing },
    });
    await expect(r.getSessionWithAccount(parent.id, stranger.id)).rejects.toMatchObject({
      code: "not_found",
    });
    await expect(r.getSessionWithAccount("nope", account.id)).rejects.toMatchObject({
      code: "invalid_input",
    });
  });
});

describe("a turn's first rows and its system prompt in one statement", () => {
  const user = (text: string): JournalWrite => ({
    body: { type: "message", message: { role: "user", content: text } },
  });
  const promptOf = async (sessionId: string) =>
    (await db.pool.query("select system_prompt from sessions where id = $1", [sessionId])).rows[0]
      ?.system_prompt;

  it("stores the prompt with the rows, and the first stored prompt stays: a later one is answered with it", async () => {
    const { r, account, child } = await started();
    expect(await promptOf(child.id)).toBeNull();
    const first = await r.appendWithSystemPrompt(child.id, account.id, [answer("a")], "prompt one");
    expect(first.systemPrompt).toBe("prompt one");
    expect(first.entries).toHaveLength(1);
    expect(await promptOf(child.id)).toBe("prompt one");
    const second = await r.appendWithSystemPrompt(
      child.id,
      account.id,
      [user("b"), answer("c")],
      "prompt two",
    );
    expect(second.systemPrompt).toBe("prompt one");
    const seq = first.entries[0]?.seq ?? 0;
    expect(second.entries.map((e) => e.seq)).toEqual([seq + 1, seq + 2]);
    expect(await promptOf(child.id)).toBe("prompt one");
    expect((await r.getSession(child.id, account.id)).systemPrompt).toBe("prompt one");
    // a plain append leaves the prompt as it is
    await r.append(child.id, account.id, [answer("d")]);
    expect(await promptOf(child.id)).toBe("prompt one");
  });

  it("writes neither rows nor prompt for another principal or an empty batch", async () => {
    const { r, account, child } = await started();
    const stranger = await r.createAccount({ name: `cr-p-${randomUUID().slice(0, 8)}` });
    await expect(r.appendWithSystemPrompt(child.id, stranger.id, [answer("x")], "p")).rejects.toMatchObject({
      code: "not_found",
    });
    expect(await r.appendWithSystemPrompt(child.id, account.id, [], "p")).toEqual({
      entries: [],
      systemPrompt: null,
    });
    expect(await promptOf(child.id)).toBeNull();
  });
});

describe("a journal's tail and the session's inbox in one statement", () => {
  it("answers what readJournalTail and settlementWork answer, for an empty journal and one with a turn after its answer", async () => {
    const { r, account, child } = await started();
    const empty = await r.journalTailWithWork(child.id, account.id);
    expect(empty.tail).toEqual(await r.readJournalTail(child.id, account.id));
    expect(empty.work).toEqual(await r.settlementWork(child.id, account.id));
    await r.append(child.id, account.id, [answer("one"), answer("two")]);
    await r.enqueueSteer(child.id, account.id, "more");
    await delegation(r, child.id, account.id, "helper");
    const out = await r.journalTailWithWork(child.id, account.id);
    expect(out.tail).toEqual(await r.readJournalTail(child.id, account.id));
    expect(out.tail.length).toBeGreaterThan(0);
    expect(out.work).toEqual({ openChildRuns: 1, pendingSteers: 1, queuedResults: 0, spills: false });
    expect(out.work).toEqual(await r.settlementWork(child.id, account.id));
  });

  it("is not_found for another principal", async () => {
    const { r, child } = await started();
    const stranger = await r.createAccount({ name: `cr-t-${randomUUID().slice(0, 8)}` });
    await expect(r.journalTailWithWork(child.id, stranger.id)).rejects.toMatchObject({ code: "not_found" });
  });

  it("for many sessions at once answers what it answers for each alone, and leaves out one it cannot see", async () => {
    const a = await started();
    const b = await started();
    const { r } = a;
    // a: a long journal (its tail only), b: a short one with its inbox busy, c: empty, d: another principal's
    const long = Array.from({ length: 70 }, (_, i) => answer(`row ${i}`));
    await r.append(a.child.id, a.account.id, [
      ...long,
      { body: { type: "message", message: { role: "user", content: "go on" } } },
    ]);
    await r.append(b.child.id, b.account.id, [answer("one"), answer("provisional", false)]);
    await r.enqueueSteer(b.child.id, b.account.id, "more");
    await delegation(r, b.child.id, b.account.id, "helper");
    const c = await started();
    const stranger = await r.createAccount({ name: `cr-t-${randomUUID().slice(0, 8)}` });
    const asked = [
      { sessionId: a.child.id, principalAccountId: a.account.id },
      { sessionId: b.child.id, principalAccountId: b.account.id },
      { sessionId: c.child.id, principalAccountId: c.account.id },
      { sessionId: a.child.id, principalAccountId: stranger.id },
    ];
    const many = await r.journalTailsWithWork(asked.slice(0, 3).concat(asked[3] as (typeof asked)[0]));
    expect([...many.keys()]).toEqual([a.child.id, b.child.id, c.child.id]);
    for (const { sessionId, principalAccountId } of asked.slice(0, 3)) {
      expect(many.get(sessionId)).toEqual(await r.journalTailWithWork(sessionId, principalAccountId));
    }
    expect(many.get(a.child.id)?.whole).toBeUndefined();
    expect(many.get(b.child.id)?.whole?.journal.entries).toHaveLength(3);
    expect((await r.journalTailsWithWork([])).size).toBe(0);
  });
});

describe("a recovered call's start appends the row its turn answers", () => {
  const interrupted: JournalWrite = {
    body: { type: "message", message: { role: "custom", customType: "interrupted", content: "go on" } },
  };
  const bodies = async (r: PgDelegationRepository, child: string, account: string) =>
    (await r.readJournal(child, account)).map((e) => e.body);

  it("a run that had started gets `resumeWith` in the start's statement; one that had not gets its task", async () => {
    const { r, account, run, child } = await started();
    await r.append(child.id, account.id, [answer("half way")]);
    const again = await r.startRun(run.id, run.generation, "owner-2", child.id, interrupted);
    expect(again).toMatchObject({ started: true, appended: true });
    const rows = await bodies(r, child.id, account.id);
    expect(rows.at(-1)).toEqual(interrupted.body);
    expect(rows).toHaveLength(3); // the task, the answer, the interrupted context

    // a queued run starts with its task, whatever `resumeWith` says
    const fresh = await queued();
    const first = await fresh.r.startRun(
      fresh.run.id,
      fresh.run.generation,
      "o",
      fresh.child.id,
      interrupted,
    );
    expect(first.appended).toBe(true);
    expect(await bodies(fresh.r, fresh.child.id, fresh.account.id)).toEqual([
      { type: "message", message: { role: "user", content: "the task" } },
    ]);
  });

  it("a start that no longer holds the run appends nothing; without `resumeWith` a started run appends nothing", async () => {
    const { r, account, run, child } = await started();
    const fenced = await r.startRun(run.id, run.generation + 1, "owner-2", child.id, interrupted);
    expect(fenced).toMatchObject({ started: false, appended: false });
    const plain = await r.startRun(run.id, run.generation, "owner-2", child.id);
    expect(plain).toMatchObject({ started: true, appended: false });
    expect(await bodies(r, child.id, account.id)).toHaveLength(1);
  });
});

describe("a fresh child's start answers its whole journal", () => {
  it("the start of a queued call answers the journal as readJournalAfter(0) reads it: the task, row 1", async () => {
    const { r, account, run, child } = await queued();
    const start = await r.startRun(run.id, run.generation, "owner", child.id);
    expect(start.journal).toEqual(await r.readJournalAfter(child.id, account.id, 0));
    expect(start.journal?.entries.map((e) => [e.seq, e.settled, e.body])).toEqual([
      [1, true, { type: "message", message: { role: "user", content: "the task" } }],
    ]);
  });

  it("answers no journal when the appended row is not the first, nothing was appended, or the child holds reclaimed or inherited rows", async () => {
    const interrupted: JournalWrite = {
      body: { type: "message", message: { role: "custom", customType: "interrupted", content: "go on" } },
    };
    const { r, run, child } = await started();
    expect(
      (await r.startRun(run.id, run.generation, "owner-2", child.id, interrupted)).journal,
    ).toBeUndefined();
    expect((await r.startRun(run.id, run.generation, "owner-2", child.id)).journal).toBeUndefined();

    for (const column of ["prefix_reclaimed_rows = 1", "inherited_through = 0"]) {
      const fresh = await queued();
      await db.pool.query(`update sessions set ${column} where id = $1`, [fresh.child.id]);
      const start = await fresh.r.startRun(fresh.run.id, fresh.run.generation, "o", fresh.child.id);
      expect(start).toMatchObject({ started: true, appended: true });
      expect(start.journal, column).toBeUndefined();
    }
  });
});

describe("a short journal comes whole with its tail", () => {
  const user = (text: string, settled = true): JournalWrite => ({
    body: { type: "message", message: { role: "user", content: text } },
    settled,
  });

  it("up to 64 rows: the tail as readJournalTail reads it, and the whole journal as readJournalAfter(0) does, with the next seq", async () => {
    const { r, account, child } = await started();
    // the task, an answer, 61 notes and a provisional row: 64 rows
    const notes = Array.from({ length: 61 }, (_, i) => user(`note ${i}`));
    await r.append(child.id, account.id, [answer("half way"), ...notes, user("cut", false)]);
    const read = await r.journalTailWithWork(child.id, account.id);
    expect(read.tail).toEqual(await r.readJournalTail(child.id, account.id));
    expect(read.whole?.journal).toEqual(await r.readJournalAfter(child.id, account.id, 0));
    expect(read.whole?.journal.entries).toHaveLength(64);
    expect(read.whole?.journal.entries.at(-1)?.settled).toBe(false);
    expect(read.whole?.nextSeq).toBe(65);
    expect(read.tail.every((e) => e.settled)).toBe(true);
  });

  it("from 65 rows the tail alone, as readJournalTail reads it", async () => {
    const { r, account, child } = await started();
    const notes = Array.from({ length: 63 }, (_, i) => user(`note ${i}`));
    await r.append(child.id, account.id, [answer("half way"), ...notes]);
    const read = await r.journalTailWithWork(child.id, account.id);
    expect(read.whole).toBeUndefined();
    expect(read.tail).toEqual(await r.readJournalTail(child.id, account.id));
    expect(read.tail).toHaveLength(64); // the answer and the notes after it
  });

  it("a started call's start answers the row it appended", async () => {
    const { r, account, run, child } = await started();
    const interrupted: JournalWrite = {
      body: { type: "message", message: { role: "custom", customType: "interrupted", content: "go on" } },
    };
    const again = await r.startRun(run.id, run.generation, "owner-2", child.id, interrupted);
    const rows = await r.readJournal(child.id, account.id);
    expect(again.row).toEqual(rows.at(-1));
    expect(again.row?.seq).toBe(2);
  });
});
