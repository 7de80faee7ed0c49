import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import pg from "pg";
import { beforeEach, describe, expect, it } from "vitest";
import { holdOwnerLease } from "../src/delegation/recovery.js";
import { OWNER_RELEASED_CHANNEL, PgDelegationRepository, type SubagentRun } from "../src/index.js";
import { family } from "./support/family.js";

const db = useTestDatabase();
const repo = () => new PgDelegationRepository(db.pool);

// Claims and the orphan check look at every open run of the database: each test starts with none open.
beforeEach(async () => {
  await db.pool.query(
    "update subagent_runs set status = 'aborted' where status in ('queued', 'running', 'settling')",
  );
  await db.pool.query("update workflows set status = 'cancelled', summary_result_id = gen_random_uuid()");
});

const openRuns = (n: number) => family(db.pool, n, "rl");

const lease = async (runId: string) =>
  (
    await db.pool.query<{ locked_by: string | null }>("select locked_by from subagent_runs where id = $1", [
      runId,
    ])
  ).rows[0]?.locked_by;

const owner = (name: string) => `${name}-${randomUUID().slice(0, 8)}`;

describe("claiming open runs", () => {
  it("at boot: unleased runs, this owner's own and dead owners' are taken, oldest first; live owners' and terminal runs are not", async () => {
    const { r, runs } = await openRuns(5);
    const [unleased, mine, dead, live, done] = runs as [
      SubagentRun,
      SubagentRun,
      SubagentRun,
      SubagentRun,
      SubagentRun,
    ];
    const me = owner("boot");
    const liveOwner = owner("live");
    const release = await r.holdOwnerLease(liveOwner);
    try {
      await r.markRunStarted(mine.id, mine.generation, me);
      await r.markRunStarted(dead.id, dead.generation, owner("dead"));
      await r.markRunStarted(live.id, live.generation, liveOwner);
      await r.settleRun({
        runId: done.id,
        generation: done.generation,
        resultId: randomUUID(),
        outcome: "ok",
        body: "",
        byteSize: 0,
      });
      // created_at decides the order, not the order the rows were written in
      await db.pool.query("update subagent_runs set created_at = now() - interval '1 hour' where id = $1", [
        dead.id,
      ]);
      const claimed = await r.claimOpenRuns(me, 100);
      expect(claimed.map((c) => c.id)).toEqual([dead.id, unleased.id, mine.id]);
      for (const c of claimed) expect(await lease(c.id)).toBe(me);
      expect(await lease(live.id)).toBe(liveOwner);
      expect(await lease(done.id)).toBeNull();
    } finally {
      await release();
    }
  });

  it("a live takeover takes only dead owners' runs: not unleased ones, not its own", async () => {
    const { r, runs } = await openRuns(3);
    const [unleased, mine, dead] = runs as [SubagentRun, SubagentRun, SubagentRun];
    const me = owner("takeover");
    const deadOwner = owner("dead");
    await r.markRunStarted(mine.id, mine.generation, me);
    await r.markRunStarted(dead.id, dead.generation, deadOwner);
    const claimed = await r.claimOpenRuns(me, 100, { deadOwnersOnly: true });
    expect(claimed.map((c) => c.id)).toEqual([dead.id]);
    expect(await lease(unleased.id)).toBeNull();
    expect(await lease(dead.id)).toBe(me);
    // with the option off, the same owner takes the unleased run too
    const boot = await r.claimOpenRuns(me, 100, { deadOwnersOnly: false });
    expect(boot.map((c) => c.id).sort()).toEqual([unleased.id, mine.id, dead.id].sort());
  });

  it("a claim takes at most its limit, the oldest first", async () => {
    const { r, runs } = await openRuns(3);
    const me = owner("limit");
    const first = await r.claimOpenRuns(me, 2);
    expect(first.map((c) => c.id)).toEqual(runs.slice(0, 2).map((x) => x.id));
    expect(await lease((runs[2] as SubagentRun).id)).toBeNull();
  });

  it("a run released by its owner is unleased again; another owner's release changes nothing", async () => {
    const { r, runs } = await openRuns(1);
    const run = runs[0] as SubagentRun;
    const me = owner("rel");
    await r.markRunStarted(run.id, run.generation, me);
    await r.releaseRun(run.id, owner("stranger"));
    expect(await lease(run.id)).toBe(me);
    await r.releaseRun(run.id, me);
    expect(await lease(run.id)).toBeNull();
    const { rows } = await db.pool.query("select locked_at from subagent_runs where id = $1", [run.id]);
    expect(rows[0]?.locked_at).toBeNull();
    await expect(r.releaseRun("bad", me)).rejects.toMatchObject({
      code: "invalid_input",
      context: { runId: "bad" },
    });
  });

  it("a run handed back names an owner nobody holds, so a live peer's takeover takes it; only the holder of an open run can hand it back", async () => {
    const { r, runs } = await openRuns(2);
    const [run, settled] = runs as [SubagentRun, SubagentRun];
    const me = owner("hand");
    const release = await r.holdOwnerLease(me);
    try {
      await r.markRunStarted(run.id, run.generation, me);
      await r.markRunStarted(settled.id, settled.generation, me);
      // while this owner holds its lease, a peer's takeover does not take the run
      expect((await r.claimOpenRuns(owner("peer"), 100, { deadOwnersOnly: true })).map((c) => c.id)).toEqual(
        [],
      );
      await r.handBackRun(run.id, owner("stranger"));
      expect(await lease(run.id)).toBe(me);
      await r.settleRun({
        runId: settled.id,
        generation: settled.generation,
        resultId: randomUUID(),
        outcome: "ok",
        body: "",
        byteSize: 0,
      });
      await r.handBackRun(settled.id, me);
      expect(await lease(settled.id)).toBeNull();
      await r.handBackRun(run.id, me);
      expect(await lease(run.id)).toBe(`${me}:handed-back`);
      const peer = owner("peer");
      expect((await r.claimOpenRuns(peer, 100, { deadOwnersOnly: true })).map((c) => c.id)).toEqual([run.id]);
      expect(await lease(run.id)).toBe(peer);
    } finally {
      await release();
    }
    await expect(r.handBackRun("bad", me)).rejects.toMatchObject({
      code: "invalid_input",
      context: { runId: "bad" },
    });
  });
});

describe("the owner lease", () => {
  it("releasing the lease announces the owner on its channel after the lock is gone", async () => {
    const r = repo();
    const me = owner("announce");
    const listener = new pg.Client({ connectionString: db.url });
    await listener.connect();
    try {
      const heard: Array<{ payload: string | undefined; othersLive: boolean }> = [];
      const got = new Promise<void>((resolve) => {
        listener.on("notification", (n) => {
          if (n.channel !== OWNER_RELEASED_CHANNEL) return;
          // checked when heard: by then the lock is no longer held
          void r.otherOwnersLive([]).then((othersLive) => {
            heard.push({ payload: n.payload, othersLive });
            resolve();
          });
        });
      });
      await listener.query(`listen ${OWNER_RELEASED_CHANNEL}`);
      const release = await r.holdOwnerLease(me);
      expect(await r.otherOwnersLive([])).toBe(true);
      await release();
      await got;
      expect(heard).toEqual([{ payload: me, othersLive: false }]);
    } finally {
      await listener.end();
    }
  });

  it("a lease that cannot be taken rejects and gives its connection up", async () => {
    // lock_timeout makes the wait for a lease another connection holds fail instead of blocking
    const pool = new pg.Pool({ connectionString: db.url, max: 2, options: "-c lock_timeout=200" });
    try {
      const r = new PgDelegationRepository(pool);
      const me = owner("twice");
      const release = await r.holdOwnerLease(me);
      await expect(r.holdOwnerLease(me)).rejects.toMatchObject({ code: "55P03" });
      // the failed attempt's connection was destroyed, not put back idle
      expect(pool.totalCount).toBe(1);
      await release();
      // released: the lease can be taken again
      const again = await r.holdOwnerLease(me);
      await again();
    } finally {
      await pool.end();
    }
  });

  it("a lease whose connection is cut is reported lost once; a released lease's connection failing later is not", async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 4 });
    pool.on("error", () => {});
    let releaseCut: (() => Promise<void>) | undefined;
    try {
      const lost: Array<{ owner: string }> = [];
      const r = new PgDelegationRepository(pool, { onLeaseLost: (o) => lost.push({ owner: o }) });
      const cut = owner("cut");
      releaseCut = await r.holdOwnerLease(cut);
      const pidOf = async (o: string) =>
        (
          await db.pool.query<{ pid: number }>(
            `select pid from pg_locks where locktype = 'advisory' and granted and classid = 7305 and objsubid = 2
                and objid = (hashtext($1)::bigint & 4294967295)::oid`,
            [o],
          )
        ).rows[0]?.pid;
      const pid = await pidOf(cut);
      expect(pid).toBeTypeOf("number");
      const kept = owner("kept");
      const releaseKept = await r.holdOwnerLease(kept);
      const keptPid = await pidOf(kept);
      await releaseKept();
      await db.pool.query("select pg_terminate_backend($1)", [pid]);
      // the released lease's connection sits idle in the pool; cut it too
      await db.pool.query("select pg_terminate_backend($1)", [keptPid]);
      await expect.poll(() => lost.length, { timeout: 5_000 }).toBe(1);
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(lost).toEqual([{ owner: cut }]);
      expect(await r.otherOwnersLive([])).toBe(false);
    } finally {
      // the cut lease's connection is dead: letting go of it fails, and gives it back to the pool all the same
      await releaseCut?.().catch(() => {});
      await pool.end();
    }
  });

  it("a lease held with no loss handler outlives the loss of its connection without an error of its own", async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    pool.on("error", () => {});
    const uncaught: unknown[] = [];
    const onUncaught = (e: unknown) => uncaught.push(e);
    process.on("uncaughtException", onUncaught);
    try {
      const bare = owner("bare");
      const release = await holdOwnerLease(pool, bare);
      await db.pool.query(
        `select pg_terminate_backend(pid) from pg_locks where locktype = 'advisory' and granted and classid = 7305
            and objsubid = 2 and objid = (hashtext($1)::bigint & 4294967295)::oid`,
        [bare],
      );
      await expect.poll(() => repo().otherOwnersLive([])).toBe(false);
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(uncaught).toEqual([]);
      await release().catch(() => {});
    } finally {
      process.off("uncaughtException", onUncaught);
      await pool.end();
    }
  });

  it("otherOwnersLive: only owners other than the given ones count", async () => {
    const r = repo();
    const a = owner("a");
    const b = owner("b");
    expect(await r.otherOwnersLive([a])).toBe(false);
    const releaseA = await r.holdOwnerLease(a);
    try {
      expect(await r.otherOwnersLive([a])).toBe(false);
      expect(await r.otherOwnersLive([b])).toBe(true);
      const releaseB = await r.holdOwnerLease(b);
      expect(await r.otherOwnersLive([a])).toBe(true);
      expect(await r.otherOwnersLive([a, b])).toBe(false);
      await releaseB();
    } finally {
      await releaseA();
    }
  });
});

describe("the orphan check", () => {
  it("runs: true only for an open run leased by an owner nobody holds", async () => {
    const { r, runs } = await openRuns(2);
    const [run, other] = runs as [SubagentRun, SubagentRun];
    expect(await r.orphanedWork()).toEqual({ runs: false, workflows: false });
    const liveOwner = owner("live");
    const release = await r.holdOwnerLease(liveOwner);
    try {
      await r.markRunStarted(run.id, run.generation, liveOwner);
      expect(await r.orphanedWork()).toEqual({ runs: false, workflows: false });
    } finally {
      await release();
    }
    expect(await r.orphanedWork()).toEqual({ runs: true, workflows: false });
    await r.settleRun({
      runId: run.id,
      generation: run.generation,
      resultId: randomUUID(),
      outcome: "ok",
      body: "",
      byteSize: 0,
    });
    expect((await r.orphanedWork()).runs).toBe(false);
    await r.markRunStarted(other.id, other.generation, owner("gone"));
    expect((await r.orphanedWork()).runs).toBe(true);
  });

  it("workflows: true for a running workflow, or one still owed its summary, leased by an owner nobody holds", async () => {
    const r = repo();
    const account = await r.createAccount({ name: `wfo-${randomUUID().slice(0, 8)}` });
    const parent = await r.createRootSession(account.id, "scripted");
    const { rows } = await db.pool.query<{ id: string }>(
      `insert into workflows (parent_session_id, principal_account_id, tool_call_id, name, locked_by)
       values ($1, $2, 'wf-1', 'wf', $3) returning id`,
      [parent.id, account.id, owner("gone")],
    );
    const wf = rows[0]?.id as string;
    expect(await r.orphanedWork()).toEqual({ runs: false, workflows: true });
    // terminal, with its journal kept and no summary yet: still owed its summary
    await db.pool.query("update workflows set status = 'completed' where id = $1", [wf]);
    expect(await r.orphanedWork()).toEqual({ runs: false, workflows: false });
    await db.pool.query("insert into workflow_journals (workflow_id, body) values ($1, '{}')", [wf]);
    expect(await r.orphanedWork()).toEqual({ runs: false, workflows: true });
    await db.pool.query("update workflows set summary_result_id = gen_random_uuid() where id = $1", [wf]);
    expect(await r.orphanedWork()).toEqual({ runs: false, workflows: false });
  });
});

describe("a continuation's new generation", () => {
  it("a charged continuation counts a recovery attempt, a free one a free continuation; each fences the old generation", async () => {
    const { r, account, runs } = await openRuns(2);
    const [run, other] = runs as [SubagentRun, SubagentRun];
    const next = async (runId: string, generation: number, charged: boolean) =>
      (await r.nextGenerations([{ runId, generation, charged }])).get(runId) ?? null;
    expect(await next(run.id, run.generation, true)).toEqual({
      generation: 2,
      recoveryAttempts: 1,
      freeContinuations: 0,
    });
    // the old generation is fenced: neither kind of continuation moves it again
    expect(await next(run.id, 1, true)).toBeNull();
    expect(await next(run.id, 1, false)).toBeNull();
    expect(await next(run.id, 2, false)).toEqual({
      generation: 3,
      recoveryAttempts: 1,
      freeContinuations: 1,
    });
    const stored = await r.getRun(run.id, account.id);
    expect([stored.generation, stored.recoveryAttempts, stored.freeContinuations]).toEqual([3, 1, 1]);
    // a terminal run has no next generation
    await r.settleRun({
      runId: run.id,
      generation: 3,
      resultId: randomUUID(),
      outcome: "ok",
      body: "",
      byteSize: 0,
    });
    expect(await next(run.id, 3, true)).toBeNull();
    expect(await next(run.id, 3, false)).toBeNull();
    await expect(next("bad", 1, true)).rejects.toMatchObject({
      code: "invalid_input",
      message: "runId is not a uuid",
      context: { runId: "bad" },
    });
    // one statement for many: each run as it asked, the one that moved on left out, nothing for none
    const both = await r.nextGenerations([
      { runId: other.id, generation: other.generation, charged: false },
      { runId: run.id, generation: 3, charged: true },
    ]);
    expect([...both]).toEqual([[other.id, { generation: 2, recoveryAttempts: 0, freeContinuations: 1 }]]);
    expect((await r.nextGenerations([])).size).toBe(0);
  });

  it("a new generation numbers its progress anew: its first snapshot is stored, the old owner's is kept until then", async () => {
    const { r, account, runs } = await openRuns(1);
    const [run] = runs as [SubagentRun];
    // the dead owner's job had published up to its fifth snapshot
    expect(await r.recordRunProgress(run.id, account.id, 1, 5, '{"seq":5}')).toBe(true);
    const moved = (await r.nextGenerations([{ runId: run.id, generation: 1, charged: false }])).get(run.id);
    expect(moved?.generation).toBe(2);
    expect((await r.getRun(run.id, account.id)).progress).toBe('{"seq":5}');
    // the continuing job starts again at 1, and the old generation can no longer write
    expect(await r.recordRunProgress(run.id, account.id, 2, 1, '{"seq":1}')).toBe(true);
    expect(await r.recordRunProgress(run.id, account.id, 1, 6, '{"seq":6}')).toBe(false);
    const stored = await r.getRun(run.id, account.id);
    expect([stored.progress, stored.progressSeq]).toEqual(['{"seq":1}', 1]);
    // a settlement's snapshot follows the same rule: a lower one than stored is not written
    await r.settleRun({
      runId: run.id,
      generation: 2,
      resultId: randomUUID(),
      outcome: "ok",
      body: "",
      byteSize: 0,
      progress: { seq: 1, snapshot: '{"seq":"again"}' },
    });
    expect((await r.getRun(run.id, account.id)).progress).toBe('{"seq":1}');
  });
});
