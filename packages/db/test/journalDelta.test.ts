import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  createPool,
  type JournalWrite,
  PgDelegationRepository,
  type QueuedResult,
  type TranscriptMessage,
} from "../src/index.js";

const db = useTestDatabase();

const user = (text: string): JournalWrite => ({
  body: { type: "message", message: { role: "user", content: text } },
});
const answer = (text: string): JournalWrite => ({
  body: {
    type: "message",
    message: { role: "assistant", content: [{ type: "text", text }], stopReason: "stop" },
  },
});
const asking = (id: string): JournalWrite => ({
  body: {
    type: "message",
    message: {
      role: "assistant",
      content: [{ type: "toolCall", id, name: "Delegate", arguments: { task: "t" } }],
      stopReason: "toolUse",
    },
  },
});
const intent = (id: string): JournalWrite => ({
  body: { type: "tool_intent", toolCallId: id, toolName: "Delegate", arguments: { task: "t" } },
});
const asMessage = (q: QueuedResult): TranscriptMessage => ({
  role: "custom",
  customType: "delegation_result",
  content: q.body,
  details: { resultId: q.id },
});

async function root() {
  const r = new PgDelegationRepository(db.pool);
  const account = await r.createAccount({ name: `delta-${randomUUID().slice(0, 8)}` });
  const session = await r.createRootSession(account.id, "scripted");
  return { r, account, session };
}

describe("reading a journal after a seq", () => {
  it("gives exactly the rows a whole read gives after that seq, rows another pool appended included", async () => {
    const { r, account, session } = await root();
    await r.append(session.id, account.id, [user("q1"), answer("a1"), user("q2")]);
    const other = createPool({ connectionString: db.url, max: 1 });
    try {
      const elsewhere = new PgDelegationRepository(other);
      await elsewhere.append(session.id, account.id, [answer("a2"), user("q3")]);
      await r.append(session.id, account.id, [answer("a3")]);
      const whole = await r.readJournal(session.id, account.id);
      for (const after of [0, 1, 3, 6]) {
        const delta = await r.readJournalAfter(session.id, account.id, after);
        expect(delta.entries).toEqual(whole.filter((e) => e.seq > after));
      }
    } finally {
      await other.end();
    }
  });

  it("names the write time of the row at the seq it reads after, and none for a seq with no settled row", async () => {
    const { r, account, session } = await root();
    const [first] = await r.append(session.id, account.id, [user("q1")]);
    await r.append(session.id, account.id, [{ ...answer("maybe"), settled: false }]);
    expect((await r.readJournalAfter(session.id, account.id, 1)).anchorCreatedAt).toEqual(first?.createdAt);
    expect((await r.readJournalAfter(session.id, account.id, 2)).anchorCreatedAt).toBeNull();
    expect((await r.readJournalAfter(session.id, account.id, 0)).anchorCreatedAt).toBeNull();
  });

  it("marks provisional rows as provisional and leaves discarded rows out", async () => {
    const { r, account, session } = await root();
    await r.append(session.id, account.id, [user("q1"), { ...answer("maybe"), settled: false }]);
    expect((await r.readJournalAfter(session.id, account.id, 0)).entries.map((e) => e.settled)).toEqual([
      true,
      false,
    ]);
    await r.settleProvisional(session.id, account.id, "discarded");
    expect((await r.readJournalAfter(session.id, account.id, 0)).entries.map((e) => e.seq)).toEqual([1]);
  });

  it("counts the rows a dream child's prefix reclamation deleted, so a reader knows its prefix is gone", async () => {
    const { r, account, session: parent } = await root();
    await r.append(parent.id, account.id, [user("q1"), answer("a1"), user("q2"), answer("a2")]);
    const { run, child } = await r.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "dream-call",
      task: "dream",
      mode: "background",
      model: "scripted",
      scope: JSON.stringify({ dream: { runId: "d" } }),
      fork: { fromSessionId: parent.id },
    });
    await r.copyJournalBranch(parent.id, child.id, account.id, 4);
    await r.commitFork(child.id, account.id);
    const before = await r.readJournalAfter(child.id, account.id, 0);
    expect(before.reclaimedRows).toBe(0);
    const resultId = randomUUID();
    await r.settleRun({
      runId: run.id,
      generation: run.generation,
      resultId,
      outcome: "ok",
      body: "x",
      byteSize: 1,
    });
    await r.deliverResults(parent.id, account.id, [resultId], asMessage);
    expect(await r.reclaimInheritedPrefix(child.id, account.id)).toMatchObject({ reclaimed: true, rows: 4 });
    const after = await r.readJournalAfter(child.id, account.id, 0);
    expect(after.reclaimedRows).toBe(4);
    expect(after.entries.length).toBe(before.entries.length - 4);
  });

  it("refuses a session the principal cannot see", async () => {
    const { r, session } = await root();
    const stranger = await r.createAccount({ name: `stranger-${randomUUID().slice(0, 8)}` });
    await expect(r.readJournalAfter(session.id, stranger.id, 0)).rejects.toMatchObject({ code: "not_found" });
  });
});

describe("a fork's branch point", () => {
  it("is the newest settled assistant message holding the tool call, with the newest settled seq", async () => {
    const { r, account, session } = await root();
    const history: JournalWrite[] = [];
    for (let i = 0; i < 50; i++) history.push(user(`q${i}`), answer(`a${i}`));
    await r.append(session.id, account.id, [...history, user("fork please"), asking("f1"), intent("f1")]);
    await r.append(session.id, account.id, [{ ...user("unsettled"), settled: false }]);
    expect(await r.forkPoint(session.id, account.id, "f1")).toEqual({ askingSeq: 102, lastSeq: 103 });
    expect(await r.forkPoint(session.id, account.id, "nobody-asked")).toEqual({
      askingSeq: null,
      lastSeq: 103,
    });
  });

  it("finds the asking message when no row of the call follows it yet, and gives 0 for an empty journal", async () => {
    const { r, account, session } = await root();
    expect(await r.forkPoint(session.id, account.id, "f1")).toEqual({ askingSeq: null, lastSeq: 0 });
    await r.append(session.id, account.id, [user("q"), asking("f1"), user("after")]);
    expect(await r.forkPoint(session.id, account.id, "f1")).toEqual({ askingSeq: 2, lastSeq: 3 });
  });
});
