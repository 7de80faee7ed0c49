import { RECLAIM_BATCH } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { DelegationError, parseDelegatedExecutionScope } from "../../src/index.js";
import {
  continueForeground,
  gateTool,
  latch,
  makeService,
  newParent,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

async function sessionCosts(id: string) {
  const { rows } = await db.pool.query<{
    inherited_through: string | null;
    prefix_reclaimed_at: Date | null;
    prefix_reclaimed_rows: string;
    prefix_reclaimed_bytes: string;
  }>(
    "select inherited_through, prefix_reclaimed_at, prefix_reclaimed_rows, prefix_reclaimed_bytes from sessions where id = $1",
    [id],
  );
  return rows[0];
}

async function journalStats(id: string, through: number) {
  const { rows } = await db.pool.query<{ n: string; b: string; own: string }>(
    `select count(*) filter (where seq <= $2)::text as n,
            coalesce(sum(octet_length(body)) filter (where seq <= $2), 0)::text as b,
            count(*) filter (where seq > $2)::text as own
       from journal_entries where session_id = $1`,
    [id, through],
  );
  return { inherited: Number(rows[0]?.n), bytes: Number(rows[0]?.b), own: Number(rows[0]?.own) };
}

describe("memory-dreaming children", () => {
  it("a dream child has no addressable conversation; its inherited prefix is reclaimed only once idle and delivered, by the store's bounded work", async () => {
    const gate = latch();
    const gates = new Map([["dream", gate.promise]]);
    const { service, repo } = makeService(db.pool, { tools: () => [gateTool("Gate", gates)] });
    const { account, parent } = await newParent(service);
    // The account's own conversation: a few turns the dream inherits.
    for (const text of ["first thought", "second thought", "third thought"])
      await service.prompt(parent.id, account.id, text);
    const receipt = await service.startDream({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      dreamRunId: "dream-1",
      task: scriptTask({ rounds: [[{ name: "Gate", arguments: { key: "dream" } }]], answer: "dreamt" }),
    });
    if (receipt.kind !== "started") throw new Error("expected a background dream");
    const child = receipt.childSessionId;
    const scope = parseDelegatedExecutionScope((await repo.getSession(child, account.id)).scope ?? "");
    expect(scope).toMatchObject({ dream: { runId: "dream-1", accountUserId: account.id }, fork: true });
    expect(scope.permissionBoundary).toBe("read-only");
    const costs = await sessionCosts(child);
    const through = Number(costs?.inherited_through);
    expect(through).toBeGreaterThan(0);

    // Not addressable: nobody prompts, continues or steers it.
    await expect(service.prompt(child, account.id, "hello")).rejects.toBeInstanceOf(DelegationError);
    await expect(continueForeground(service, { parent, account }, child, "c", "more")).rejects.toMatchObject({
      code: "invalid_input",
    });

    // Its call is open: nothing is reclaimed.
    expect(await service.reclaimDreamPrefix(child, account.id)).toMatchObject({ reclaimed: false });
    expect((await service.reclaimDreamPrefix(child, account.id)).reason).toMatch(/busy|open_call/);

    // Terminal but not yet delivered (the parent is busy): still nothing.
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    const busy = service.turns.exclusive(parent.id, () => held);
    gate.open();
    await waitFor(
      async () => (await repo.queuedResultIds(parent.id, account.id)).length === 1,
      "the dream's result",
    );
    await waitFor(async () => !service.turns.isBusy(child), "the dream to be idle");
    expect(await service.reclaimDreamPrefix(child, account.id)).toMatchObject({
      reclaimed: false,
      reason: "undelivered_result",
    });
    const before = await journalStats(child, through);
    expect(before.inherited).toBe(through);

    // Delivered: the inherited prefix goes, its marker and costs are kept; the dream's own output stays.
    release();
    await busy;
    service.parentIdle(await repo.getSession(parent.id, account.id));
    await waitFor(
      async () => (await repo.settledResultIds(parent.id, account.id)).length === 1,
      "the delivery",
    );
    await service.whenIdle();
    const done = await service.reclaimDreamPrefix(child, account.id);
    expect(done).toEqual({ reclaimed: true, rows: before.inherited, bytes: before.bytes });
    const after = await journalStats(child, through);
    expect(after).toEqual({ inherited: 0, bytes: 0, own: before.own });
    const marked = await sessionCosts(child);
    expect(marked?.prefix_reclaimed_at).not.toBeNull();
    expect(Number(marked?.prefix_reclaimed_rows)).toBe(before.inherited);
    expect(Number(marked?.prefix_reclaimed_bytes)).toBe(before.bytes);
    expect(await service.readSubagent(parent.id, child, account.id)).toBe("dreamt");
    expect(await service.reclaimDreamPrefix(child, account.id)).toMatchObject({
      reclaimed: false,
      reason: "already_reclaimed",
    });
    // The parent's own journal is untouched.
    expect((await repo.readJournal(parent.id, account.id)).length).toBeGreaterThan(through);
    await service.close();
  });

  it("an ordinary fork's inherited prefix is never reclaimed; a long prefix goes in bounded batches", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    await service.prompt(parent.id, account.id, "context");
    const fork = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "f",
      task: scriptTask({ answer: "forked" }),
      mode: "foreground",
      fork: true,
    });
    if (fork.kind !== "result") throw new Error("expected a result");
    expect(await service.reclaimDreamPrefix(fork.childSessionId, account.id)).toMatchObject({
      reclaimed: false,
      reason: "not_dream",
    });

    // A conversation longer than one batch.
    const long = Array.from({ length: RECLAIM_BATCH + 20 }, (_, i) => ({
      body: { type: "message" as const, message: { role: "user" as const, content: `note ${i}` } },
    }));
    await repo.append(parent.id, account.id, long);
    const receipt = await service.startDream({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      dreamRunId: "dream-long",
      task: scriptTask({ answer: "long dream" }),
    });
    if (receipt.kind !== "started") throw new Error("expected a background dream");
    await waitFor(
      async () => (await repo.settledResultIds(parent.id, account.id)).length >= 1,
      "the delivery",
    );
    await service.whenIdle();
    const through = Number((await sessionCosts(receipt.childSessionId))?.inherited_through);
    expect(through).toBeGreaterThan(RECLAIM_BATCH);
    const done = await service.reclaimDreamPrefix(receipt.childSessionId, account.id);
    expect(done).toMatchObject({ reclaimed: true, rows: through });
    expect(await service.readSubagent(parent.id, receipt.childSessionId, account.id)).toBe("long dream");
    await service.close();
  });
});
