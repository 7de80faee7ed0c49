import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  bearsUsage,
  PgDelegationRepository,
  type ProviderUsage,
  recordProviderUsage,
  sessionPrincipal,
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

describe("provider usage per response", () => {
  it("each response's report is a row of its own with every figure, a missing cost stored as 0", async () => {
    const { session } = await root();
    const turnId = `turn-${randomUUID()}`;
    await recordProviderUsage(db.pool, { sessionId: session.id, turnId, runnerId: "r1", usage });
    const { cost: _, ...free } = usage;
    await recordProviderUsage(db.pool, { sessionId: session.id, turnId, runnerId: "r1", usage: free });
    const { rows } = await db.pool.query(
      `select runner_id, api, provider, model, stop_reason, input_tokens, output_tokens, cache_read_tokens,
              cache_write_tokens, total_tokens, cost::float8 as cost
         from provider_usage where session_id = $1::uuid and turn_id = $2 order by cost desc`,
      [session.id, turnId],
    );
    const figures = {
      runner_id: "r1",
      api: usage.api,
      provider: usage.provider,
      model: usage.model,
      stop_reason: usage.stopReason,
      input_tokens: usage.input,
      output_tokens: usage.output,
      cache_read_tokens: usage.cacheRead,
      cache_write_tokens: usage.cacheWrite,
      total_tokens: usage.totalTokens,
    };
    expect(
      rows.map((r) => ({
        ...r,
        input_tokens: Number(r.input_tokens),
        output_tokens: Number(r.output_tokens),
        cache_read_tokens: Number(r.cache_read_tokens),
        cache_write_tokens: Number(r.cache_write_tokens),
        total_tokens: Number(r.total_tokens),
      })),
    ).toEqual([
      { ...figures, cost: usage.cost },
      { ...figures, cost: 0 },
    ]);
  });

  it("a session's account is read by its id alone; an unknown session has none", async () => {
    const { account, session } = await root();
    expect(await sessionPrincipal(db.pool, session.id)).toBe(account.id);
    expect(await sessionPrincipal(db.pool, randomUUID())).toBeNull();
  });
});
