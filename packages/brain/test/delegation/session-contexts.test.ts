import { randomUUID } from "node:crypto";
import {
  createPool,
  type DelegationRepository,
  type JournalEntry,
  type JournalWrite,
  PgDelegationRepository,
  type QueuedResult,
  type TranscriptMessage,
} from "@crw/db";
import { journalRows } from "@crw/tools/delegation";
import { useTestDatabase } from "@crw/tools/pg";
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { contextFromJournal, extendFold, foldJournal } from "../../src/delegation/context.js";
import { SessionContexts } from "../../src/delegation/sessionContexts.js";
import { makeService, newParent } from "./helpers.js";

const db = useTestDatabase();
const { user, answer } = journalRows;
const compaction = (summary: string, firstKeptSeq: number): JournalWrite => ({
  body: { type: "compaction", summary, firstKeptSeq },
});

/** A pool that counts the statements sent through it and the rows they return. */
function countingPool(pool: pg.Pool) {
  const seen = { statements: 0, rows: 0 };
  const counted =
    (query: (...a: unknown[]) => Promise<pg.QueryResult>) =>
    async (...args: unknown[]) => {
      seen.statements++;
      const result = await query(...args);
      seen.rows += result.rows?.length ?? 0;
      return result;
    };
  const forward = <T extends object>(target: T, wrap: (key: string | symbol) => unknown) =>
    new Proxy(target, {
      get(t, key) {
        const wrapped = wrap(key);
        if (wrapped) return wrapped;
        const v = Reflect.get(t, key) as unknown;
        return typeof v === "function" ? v.bind(t) : v;
      },
    });
  const counting = forward(pool, (key) => {
    if (key === "query") return counted(pool.query.bind(pool) as never);
    if (key !== "connect") return undefined;
    return async () => {
      const client = await pool.connect();
      return forward(client, (k) =>
        k === "query" ? counted(client.query.bind(client) as never) : undefined,
      );
    };
  });
  return { pool: counting, seen };
}

async function root(repo: DelegationRepository) {
  const account = await repo.createAccount({ name: `ctx-${randomUUID().slice(0, 8)}` });
  const session = await repo.createRootSession(account.id, "scripted");
  return { account, session };
}

const whole = async (repo: DelegationRepository, sessionId: string, accountId: string) =>
  contextFromJournal(await repo.readJournal(sessionId, accountId));

const conversation = (turns: number, tag = "q"): JournalWrite[] =>
  Array.from({ length: turns }, (_, i) => [user(`${tag}${i}`), answer(`a${i}`)]).flat();

async function appendMany(
  repo: DelegationRepository,
  sessionId: string,
  accountId: string,
  rows: JournalWrite[],
) {
  for (let at = 0; at < rows.length; at += 500)
    await repo.append(sessionId, accountId, rows.slice(at, at + 500));
}

describe("a session's folded context", () => {
  it("folding the rows after a fold gives what folding the whole journal gives, compactions included", () => {
    let state = 7;
    const next = (n: number) => {
      state = (state * 1103515245 + 12345) % 2147483648;
      return state % n;
    };
    for (let round = 0; round < 300; round++) {
      const entries: JournalEntry[] = [];
      const length = 1 + next(30);
      for (let seq = 1; seq <= length; seq++) {
        const kind = next(6);
        const body: JournalEntry["body"] =
          kind === 0
            ? { type: "compaction", summary: `s${seq}`, firstKeptSeq: 1 + next(seq + 2) }
            : kind === 1
              ? { type: "tool_intent", toolCallId: `c${seq}`, toolName: "Work", arguments: {} }
              : { type: "message", message: { role: "user", content: `m${seq}` } };
        entries.push({ sessionId: "s", seq, body, settled: true, createdAt: new Date(0) });
      }
      const at = next(length + 1);
      const extended = extendFold(foldJournal(entries.slice(0, at)), entries.slice(at));
      // A compaction keeping rows from before the kept seq in force (held or newer) has rows the fold no
      // longer holds: the fold says it cannot extend, and the whole journal is folded instead.
      let keptFrom = foldJournal(entries.slice(0, at)).keptFrom;
      let reachesBack = false;
      for (const e of entries.slice(at)) {
        if (e.body.type !== "compaction") continue;
        if (e.body.firstKeptSeq < keptFrom) reachesBack = true;
        keptFrom = e.body.firstKeptSeq;
      }
      if (reachesBack) expect(extended).toBeUndefined();
      else expect(extended).toEqual(foldJournal(entries));
    }
  });

  it("after appends by this process and by another pool, and after compactions, the context is the whole journal's", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const { account, session } = await root(repo);
    const other = createPool({ connectionString: db.url, max: 1 });
    try {
      const elsewhere = new PgDelegationRepository(other);
      const contexts = new SessionContexts(repo);
      const steps: Array<[DelegationRepository, JournalWrite[]]> = [
        [repo, conversation(3)],
        [elsewhere, [user("from the other daemon"), answer("seen")]],
        [repo, [compaction("the first six", 5), user("after compaction")]],
        [elsewhere, [answer("more"), compaction("shorter", 9)]],
        [repo, [compaction("back to the start", 2), user("last")]],
      ];
      expect(await contexts.contextOf(session.id, account.id)).toEqual([]);
      for (const [by, rows] of steps) {
        await by.append(session.id, account.id, rows);
        expect(await contexts.contextOf(session.id, account.id)).toEqual(
          await whole(repo, session.id, account.id),
        );
      }
    } finally {
      await other.end();
    }
  });

  it("once folded, a read returns only the rows appended since", async () => {
    const counting = countingPool(db.pool);
    const repo = new PgDelegationRepository(counting.pool);
    const { account, session } = await root(repo);
    await appendMany(repo, session.id, account.id, conversation(300));
    const contexts = new SessionContexts(repo);
    await contexts.contextOf(session.id, account.id);
    await repo.append(session.id, account.id, [user("one more")]);
    const before = { ...counting.seen };
    const context = await contexts.contextOf(session.id, account.id);
    expect(context.at(-1)).toEqual({ role: "user", content: "one more" });
    expect(counting.seen.statements - before.statements).toBe(1);
    // The row the fold ends at (its identity) and the new one.
    expect(counting.seen.rows - before.rows).toBe(2);
  });

  it("a provisional row that settles later takes its place before the settled rows that followed it", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const { account, session } = await root(repo);
    const contexts = new SessionContexts(repo);
    await repo.append(session.id, account.id, [user("q1"), { ...answer("provisional"), settled: false }]);
    await repo.append(session.id, account.id, [user("q2")]);
    expect(await contexts.contextOf(session.id, account.id)).toEqual(
      await whole(repo, session.id, account.id),
    );
    expect(await repo.settleProvisional(session.id, account.id, "settled")).toBe(1);
    const context = await contexts.contextOf(session.id, account.id);
    expect(context.map((m) => m.role)).toEqual(["user", "assistant", "user"]);
    expect(context).toEqual(await whole(repo, session.id, account.id));
  });

  it("a journal written anew below the fold (a database restored to an earlier point) is read whole", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const { account, session } = await root(repo);
    const contexts = new SessionContexts(repo);
    await repo.append(session.id, account.id, conversation(3));
    await contexts.contextOf(session.id, account.id);
    // The restore: rows after seq 2 are gone and the seqs go on from there. The rows written after it are
    // written later (a restore and new turns take far longer than a millisecond, and so does this wait).
    await db.pool.query("delete from journal_entries where session_id = $1 and seq > 2", [session.id]);
    await db.pool.query("update sessions set next_seq = 3 where id = $1", [session.id]);
    await new Promise((r) => setTimeout(r, 5));
    await repo.append(session.id, account.id, conversation(3, "other"));
    expect(await contexts.contextOf(session.id, account.id)).toEqual(
      await whole(repo, session.id, account.id),
    );
  });

  it("a dream child's reclaimed prefix is not served from the fold", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const { account, session: parent } = await root(repo);
    await repo.append(parent.id, account.id, conversation(2));
    const { run, child } = await repo.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "dream-call",
      task: "dream",
      mode: "background",
      model: "scripted",
      scope: JSON.stringify({ dream: { runId: "d" } }),
      fork: { fromSessionId: parent.id },
    });
    await repo.copyJournalBranch(parent.id, child.id, account.id, 4);
    await repo.commitFork(child.id, account.id);
    await repo.append(child.id, account.id, [user("dream task"), answer("dreamt")]);
    const contexts = new SessionContexts(repo);
    expect(await contexts.contextOf(child.id, account.id)).toHaveLength(6);
    const resultId = randomUUID();
    await repo.settleRun({
      runId: run.id,
      generation: run.generation,
      resultId,
      outcome: "ok",
      body: "x",
      byteSize: 1,
    });
    const asMessage = (q: QueuedResult): TranscriptMessage => ({
      role: "custom",
      customType: "delegation_result",
      content: q.body,
      details: { resultId: q.id },
    });
    await repo.deliverResults(parent.id, account.id, [resultId], asMessage);
    expect(await repo.reclaimInheritedPrefix(child.id, account.id)).toMatchObject({ reclaimed: true });
    const context = await contexts.contextOf(child.id, account.id);
    expect(context).toEqual(await whole(repo, child.id, account.id));
    expect(context).toHaveLength(2);
  });

  it("the context handed out is the caller's own: pushing to it or changing a message leaves the next read as the journal says", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const { account, session } = await root(repo);
    const contexts = new SessionContexts(repo);
    await repo.append(session.id, account.id, conversation(2));
    const first = await contexts.contextOf(session.id, account.id);
    first.push({ role: "user", content: "pushed by a runner" });
    expect(() => {
      (first[0] as { content: string }).content = "changed by a runner";
    }).toThrow(TypeError);
    expect(await contexts.contextOf(session.id, account.id)).toEqual(
      await whole(repo, session.id, account.id),
    );
  });

  it("keeps at most its bound of sessions, the least recently used going first, and no session over its byte bound", async () => {
    const counting = countingPool(db.pool);
    const repo = new PgDelegationRepository(counting.pool);
    const sessions = [await root(repo), await root(repo), await root(repo)];
    for (const { account, session } of sessions) await repo.append(session.id, account.id, conversation(20));
    const contexts = new SessionContexts(repo, { sessions: 2, bytes: 1_000_000 });
    const read = async (i: number) => {
      const s = sessions[i];
      if (!s) throw new Error("no such session");
      const before = counting.seen.rows;
      await contexts.contextOf(s.session.id, s.account.id);
      return counting.seen.rows - before;
    };
    expect([await read(0), await read(1), await read(0), await read(2)]).toEqual([40, 40, 1, 40]);
    expect(contexts.size.sessions).toBe(2);
    // Session 1 was the least recently used: it went and is read whole again; session 0 stayed.
    expect([await read(1), await read(0)]).toEqual([40, 40]);
    const small = new SessionContexts(repo, { sessions: 10, bytes: 100 });
    const s = sessions[0];
    if (!s) throw new Error("no such session");
    await small.contextOf(s.session.id, s.account.id);
    expect(small.size).toEqual({ sessions: 0, bytes: 0 });
  });
});

describe("a turn's database cost", () => {
  it("a turn of a 10,000-entry session sends as many statements as one of a 100-entry session and reads only a few rows", async () => {
    const counting = countingPool(db.pool);
    const { service, repo } = makeService(counting.pool);
    const cost = async (entries: number) => {
      const { account, parent } = await newParent(service);
      await appendMany(repo, parent.id, account.id, conversation(entries / 2));
      await service.prompt(parent.id, account.id, "first");
      await service.whenIdle();
      const before = { ...counting.seen };
      await service.prompt(parent.id, account.id, "second");
      await service.whenIdle();
      return {
        statements: counting.seen.statements - before.statements,
        rows: counting.seen.rows - before.rows,
      };
    };
    const small = await cost(100);
    const large = await cost(10_000);
    expect(large.statements).toBe(small.statements);
    expect(large.statements).toBeLessThanOrEqual(15);
    expect(large.rows).toBeLessThanOrEqual(small.rows + 5);
    expect(large.rows).toBeLessThan(50);
    await service.close();
  });
});
