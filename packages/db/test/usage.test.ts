import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  bearsUsage,
  PgDelegationRepository,
  type ProviderUsage,
  type TranscriptMessage,
} from "../src/index.js";

const db = useTestDatabase();

const usage: ProviderUsage = {
  api: "anthropic-messages",
  provider: "anthropic",
  model: "claude-test",
  stopReason: "stop",
  input: 12,
  output: 7,
  cacheRead: 900,
  cacheWrite: 40,
  totalTokens: 959,
  cost: 0.0123,
};
const answer: TranscriptMessage = {
  role: "assistant",
  content: [{ type: "text", text: "ok" }],
  stopReason: "stop",
};

async function root() {
  const r = new PgDelegationRepository(db.pool);
  const account = await r.createAccount({ name: `usage-${randomUUID().slice(0, 8)}` });
  const session = await r.createRootSession(account.id, "scripted");
  return { r, account, session };
}

describe("provider usage beside the journal", () => {
  it("is stored with its assistant row, outside the row's original JSON, and read back with the row", async () => {
    const { r, account, session } = await root();
    await r.append(session.id, account.id, [
      { body: { type: "message", message: { role: "user", content: "hi" } } },
      { body: { type: "message", message: answer }, usage },
      { body: { type: "message", message: answer } },
    ]);
    const { rows } = await db.pool.query<{ seq: string; body: string; provider_usage: unknown }>(
      "select seq, body, provider_usage from journal_entries where session_id = $1 order by seq",
      [session.id],
    );
    // The body is the message's JSON only: exactly what it was before usage existed.
    expect(rows[1]?.body).toBe(JSON.stringify({ type: "message", message: answer }));
    expect(rows[1]?.provider_usage).toEqual(usage);
    expect(rows[2]?.provider_usage).toBeNull();
    const recent = await r.recentAssistantMessages(session.id, account.id, 32);
    expect(recent.map((x) => [x.seq, x.usage])).toEqual([
      [3, undefined],
      [2, usage],
    ]);
    const journal = await r.readJournal(session.id, account.id);
    expect(journal[1]?.body).toEqual({ type: "message", message: answer });
  });

  it("is refused on a row that is not an assistant message, and when malformed; nothing is written", async () => {
    const { r, account, session } = await root();
    await expect(
      r.append(session.id, account.id, [
        { body: { type: "message", message: { role: "user", content: "hi" } }, usage },
      ]),
    ).rejects.toMatchObject({ code: "malformed_entry" });
    await expect(
      r.append(session.id, account.id, [
        { body: { type: "message", message: answer }, usage: { ...usage, input: -1 } },
      ]),
    ).rejects.toMatchObject({ code: "malformed_entry" });
    expect(await r.readJournal(session.id, account.id)).toEqual([]);
    // The database refuses it too, whoever writes.
    await expect(
      db.pool.query(
        `insert into journal_entries (session_id, seq, kind, role, body, provider_usage)
         values ($1, 1, 'message', 'user', '{}', '{"input": 1}')`,
        [session.id],
      ),
    ).rejects.toMatchObject({ code: "23514" });
  });

  it("a fork's copied rows carry no usage (inherited context is not the fork's response); its inherited prefix is on its row", async () => {
    const { r, account, session } = await root();
    await r.append(session.id, account.id, [
      { body: { type: "message", message: { role: "user", content: "context" } } },
      { body: { type: "message", message: answer }, usage },
    ]);
    const fork = await r.createDelegation({
      parentSessionId: session.id,
      principalAccountId: account.id,
      toolCallId: "fork-usage",
      task: "forked",
      mode: "background",
      model: "scripted",
      scope: "{}",
      fork: { fromSessionId: session.id },
    });
    const child = fork.child;
    expect(await r.copyJournalBranch(session.id, child.id, account.id, 2)).toBe(2);
    await r.commitFork(child.id, account.id);
    const copied = await r.recentAssistantMessages(child.id, account.id, 32);
    expect(copied).toEqual([{ seq: 2, message: answer }]);
    expect((await r.getSession(child.id, account.id)).inheritedThrough).toBe(2);
    expect((await r.getSession(session.id, account.id)).inheritedThrough).toBeNull();
  });

  it("bearsUsage: a usage with no figures does not count", () => {
    expect(bearsUsage(usage)).toBe(true);
    expect(bearsUsage({ ...usage, input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0 })).toBe(
      false,
    );
    expect(bearsUsage(undefined)).toBe(false);
  });
});
