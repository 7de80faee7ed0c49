import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { PgDelegationRepository } from "../src/index.js";

const db = useTestDatabase();
const repo = () => new PgDelegationRepository(db.pool);

async function queuedRun(task: string) {
  const r = repo();
  const account = await r.createAccount({ name: `start-${randomUUID().slice(0, 8)}` });
  const parent = await r.createRootSession(account.id, "scripted");
  const { run, child } = await r.createDelegation({
    parentSessionId: parent.id,
    principalAccountId: account.id,
    toolCallId: "call-1",
    task,
    mode: "background",
    model: "scripted",
    scope: "{}",
  });
  return { r, account, parent, run, child };
}

const bodyRows = async (sessionId: string) =>
  (
    await db.pool.query<{ seq: string; body: string }>(
      "select seq, body from journal_entries where session_id = $1 order by seq",
      [sessionId],
    )
  ).rows;

describe("a run's start and the journal's appends, each one statement", () => {
  it("the start journals the task once, with the same JSON text an append of that user message stores", async () => {
    const tricky = 'quote " backslash \\ newline \n tab \t bell \u0007 unicode é 漢 😀 \u2028 end';
    const { r, account, run, child } = await queuedRun(tricky);
    const started = await r.startRun(run.id, run.generation, "owner-a", child.id);
    expect(started).toMatchObject({ started: true, appended: true });
    expect(started.child?.id).toBe(child.id);
    // the reference: the same message through append, into a second session
    const other = await r.createRootSession(account.id, "scripted");
    await r.append(other.id, account.id, [
      { body: { type: "message", message: { role: "user", content: tricky } } },
    ]);
    const [taskRow] = await bodyRows(child.id);
    const [reference] = await bodyRows(other.id);
    expect(taskRow?.body).toBe(reference?.body);
    expect(JSON.parse(taskRow?.body ?? "")).toEqual({
      type: "message",
      message: { role: "user", content: tricky },
    });

    // started again (a second process, a retry): running stays running and the task is not journaled twice
    const again = await r.startRun(run.id, run.generation, "owner-b");
    expect(again).toMatchObject({ started: true, appended: false });
    expect(await bodyRows(child.id)).toHaveLength(1);
    // a stale generation does not start and writes nothing
    const stale = await r.startRun(run.id, run.generation + 1, "owner-c");
    expect(stale).toMatchObject({ started: false, appended: false });
    expect(await bodyRows(child.id)).toHaveLength(1);
  });

  it("a queued run whose child session was deleted is not started, and nothing is journaled", async () => {
    const { r, run, child } = await queuedRun("lost");
    await db.pool.query("delete from sessions where id = $1", [child.id]);
    const out = await r.startRun(run.id, run.generation, "owner-a");
    expect(out).toMatchObject({ started: false, appended: false });
    const { rows } = await db.pool.query<{ status: string }>(
      "select status from subagent_runs where id = $1",
      [run.id],
    );
    expect(rows[0]?.status).toBe("queued");
    expect(await bodyRows(child.id)).toHaveLength(0);
  });

  it("appends racing on one journal get gapless, distinct seqs in one statement each", async () => {
    const r = repo();
    const account = await r.createAccount({ name: `race-${randomUUID().slice(0, 8)}` });
    const session = await r.createRootSession(account.id, "scripted");
    const writers = Array.from({ length: 20 }, (_, i) =>
      r.append(session.id, account.id, [
        { body: { type: "message", message: { role: "user", content: `a${i}` } } },
        { body: { type: "message", message: { role: "user", content: `b${i}` } } },
      ]),
    );
    const written = await Promise.all(writers);
    for (const pair of written) expect(pair.map((e) => e.seq)[1]).toBe((pair[0]?.seq ?? 0) + 1);
    const seqs = (await bodyRows(session.id)).map((row) => Number(row.seq));
    expect(seqs).toEqual(Array.from({ length: 40 }, (_, i) => i + 1));
    const { rows } = await db.pool.query<{ next_seq: string }>(
      "select next_seq from sessions where id = $1",
      [session.id],
    );
    expect(Number(rows[0]?.next_seq)).toBe(41);
  });

  it("an append to a session that does not exist is refused with a typed error and writes nothing", async () => {
    const r = repo();
    const account = await r.createAccount({ name: `none-${randomUUID().slice(0, 8)}` });
    const missing = randomUUID();
    await expect(
      r.append(missing, account.id, [{ body: { type: "message", message: { role: "user", content: "x" } } }]),
    ).rejects.toMatchObject({ code: "not_found" });
    expect(await bodyRows(missing)).toHaveLength(0);
  });
});
