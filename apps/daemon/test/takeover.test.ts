import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ModelReply, type ModelRequest, type ModelServer, startModelServer } from "@crw/tools/models";
import { useTestDatabase } from "@crw/tools/pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TestClient } from "./support/client.js";
import { healthWith } from "./support/health.js";
import { type DaemonProcess, spawnDaemon } from "./support/process.js";
import { waitFor } from "./support/wait.js";
import { startTwoNodeWorkflow } from "./support/workflows.js";

/**
 * Live takeover: three daemon processes share one PostgreSQL. Work submitted to daemon A (background
 * delegations and a two-node workflow, all under one root session) is held mid-turn by the model server;
 * while A lives, B and C sweep and take nothing. A is SIGKILLed and nothing is restarted: B and C claim
 * A's calls and its workflow as boot recovery would (one attempt charged per continuation), finish all of
 * it, and deliver every result to the root session exactly once, with the root's follow-up turn run on a
 * live daemon. A daemon that stops gracefully announces its release, and a peer whose periodic sweep is
 * far off takes its work at once.
 */
const db = useTestDatabase();
const KEY = "CRW_TEST_TAKEOVER_KEY";
const CHILDREN = 6;
let models: ModelServer;
let release: () => void = () => {};
let released = new Promise<void>((r) => {
  release = r;
});
/** The held tasks the model server has seen (CHILD-n, NODE-x), each counted once. */
const seen = new Set<string>();
const made: string[] = [];
const daemons: DaemonProcess[] = [];

async function answer(request: ModelRequest): Promise<ModelReply> {
  const text = request.userTexts.join("\n");
  // The root session's follow-up reads its delivered results (which quote the children's answers).
  if (text.includes("[delegation result for call") || text.includes("[workflow summary"))
    return { text: "the parent read its results" };
  const tag = /(CHILD-\d+|NODE-\w+)/.exec(text)?.[1];
  if (!tag) return { text: "noted" };
  seen.add(tag);
  // Held until the test lets go: the turn is in flight when its daemon dies.
  await released;
  return { text: `${tag.startsWith("NODE") ? "node" : "child"} work finished` };
}

beforeAll(async () => {
  models = await startModelServer(answer);
});

afterAll(async () => {
  for (const d of daemons) if (d.child.exitCode === null) d.child.kill("SIGKILL");
  await Promise.all(daemons.map((d) => d.exited));
  await models?.close();
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

const start = async (name: string, takeoverSweepMs: number): Promise<DaemonProcess> => {
  const dataDir = mkdtempSync(join(tmpdir(), `crw-takeover-${name}-`));
  made.push(dataDir);
  const d = await spawnDaemon({
    dataDir,
    databaseUrl: db.url,
    runtime: { maxRunners: 1, turnsPerRunner: 8, takeoverSweepMs },
    env: {
      CRW_MODEL: "openai-completions:loopback",
      CRW_MODEL_BASE_URL: models.openaiBaseUrl,
      CRW_MODEL_API_KEY_ENV: KEY,
      [KEY]: "secret",
    },
  });
  daemons.push(d);
  return d;
};

interface Takeover {
  sweeps: number;
  passes: number;
  releasesHeard: number;
  delegations: { continued: number; settled: number; terminalized: number; failed: number };
  workflows: { resumed: number };
  roots: number;
}

const takeoverOf = async (d: DaemonProcess): Promise<Takeover> =>
  ((await healthWith(d.url, d.token)) as { takeover: Takeover }).takeover;

/** Submits CHILDREN background delegations and a two-node workflow to `d`, under one new root session. */
async function submit(d: DaemonProcess): Promise<{ sessionId: string; workflowId: string }> {
  const client = await TestClient.connect(d.url, d.token);
  try {
    const { sessionId } = await client.ok<{ sessionId: string }>("session.create", {});
    for (let i = 0; i < CHILDREN; i++)
      await client.ok("session.delegate", { sessionId, task: `CHILD-${i}: do the work`, background: true });
    const workflowId = await startTwoNodeWorkflow(client, sessionId, "takeover");
    return { sessionId, workflowId };
  } finally {
    client.close();
  }
}

/** The rows that say whether everything under the root session finished and was delivered. */
async function progressOf(sessionId: string, workflowId: string) {
  const { rows } = await db.pool.query(
    `select (select count(*)::int from subagent_runs where parent_session_id = $1::uuid and status = 'succeeded') as ok,
            (select count(*)::int from subagent_runs where parent_session_id = $1::uuid
                and status in ('queued', 'running', 'settling')) as open,
            (select status from workflows where id = $2::uuid) as workflow,
            (select count(*)::int from delegation_results where parent_session_id = $1::uuid) as results,
            (select count(*)::int from delegation_result_acks a join delegation_results r on r.id = a.result_id
              where r.parent_session_id = $1::uuid) as acks`,
    [sessionId, workflowId],
  );
  return rows[0] as { ok: number; open: number; workflow: string; results: number; acks: number };
}

/** Every result of the root session is in its journal exactly once (none missing, none twice). */
async function assertDeliveredOnce(sessionId: string): Promise<void> {
  const { rows } = await db.pool.query(
    `select r.id, (select count(*)::int from journal_entries j
                    where j.session_id = $1::uuid and j.result_id = r.id and not j.discarded) as entries,
            (select count(*)::int from delegation_result_acks a where a.result_id = r.id) as acks
       from delegation_results r where r.parent_session_id = $1::uuid`,
    [sessionId],
  );
  expect(rows.length).toBe(CHILDREN + 1);
  for (const r of rows)
    expect({ id: r.id, entries: r.entries, acks: r.acks }).toEqual({ id: r.id, entries: 1, acks: 1 });
}

/** One installation: a token issued on one daemon works on every other; revoked on one, it is refused on all. */
async function tokensAcross(a: DaemonProcess, b: DaemonProcess, c: DaemonProcess): Promise<void> {
  const onA = await TestClient.connect(a.url, a.token);
  try {
    const name = `team-${Date.now()}`;
    await onA.ok("account.create", { name });
    const issued = await onA.ok<{ token: string; id: string }>("token.issue", { account: name });
    const open: TestClient[] = [];
    for (const d of [a, b, c]) {
      const client = await TestClient.connect(d.url, issued.token);
      open.push(client);
      expect(await client.ok("daemon.whoami")).toMatchObject({ name });
    }
    const closed = open.map((client) => new Promise((r) => client.ws.once("close", (code) => r(code))));
    const onC = await TestClient.connect(c.url, b.token);
    await onC.ok("token.revoke", { id: issued.id });
    onC.close();
    expect(await Promise.all(closed)).toEqual([1008, 1008, 1008]);
    for (const d of [a, b, c]) await expect(TestClient.connect(d.url, issued.token)).rejects.toThrow(/401/);
  } finally {
    onA.close();
  }
}

describe("live takeover of a dead daemon's work", () => {
  it("a token issued on A works on B and C and, revoked on C, is refused on all three; B and C take nothing while A lives, then finish and deliver all of SIGKILLed A's work exactly once", async () => {
    const [a, b, c] = await Promise.all([start("a", 300), start("b", 300), start("c", 300)]);
    await tokensAcross(a, b, c);
    const { sessionId, workflowId } = await submit(a);
    await waitFor(() => seen.size === CHILDREN + 1, "every child and the first node to be in flight on A");

    // Phase 1: all three live. B and C sweep several times and take nothing; A holds every lease.
    await waitFor(
      async () => (await takeoverOf(b)).sweeps >= 5 && (await takeoverOf(c)).sweeps >= 5,
      "B and C to sweep",
    );
    for (const d of [b, c]) {
      const t = await takeoverOf(d);
      expect(t.passes).toBe(0);
      expect(t.delegations.continued + t.workflows.resumed).toBe(0);
    }
    const owners = await db.pool.query(
      `select distinct locked_by from subagent_runs where parent_session_id = $1::uuid`,
      [sessionId],
    );
    expect(owners.rows).toHaveLength(1);
    const aOwner = String(owners.rows[0].locked_by);
    const wf = await db.pool.query("select locked_by, status from workflows where id = $1::uuid", [
      workflowId,
    ]);
    expect(wf.rows[0]).toEqual({ locked_by: `${aOwner}-workflows`, status: "running" });
    expect((await progressOf(sessionId, workflowId)).results).toBe(0);

    // Phase 2: A dies; nothing is restarted. The held turns are answered from now on (A's to dead sockets).
    const killedAt = new Date();
    a.child.kill("SIGKILL");
    await a.exited;
    release();
    await waitFor(
      async () => {
        const p = await progressOf(sessionId, workflowId);
        return p.ok === CHILDREN && p.workflow === "completed" && p.acks === CHILDREN + 1;
      },
      "B and C to finish and deliver all of A's work",
      90_000,
    );
    const p = await progressOf(sessionId, workflowId);
    expect(p).toMatchObject({ open: 0, results: CHILDREN + 1 });
    await assertDeliveredOnce(sessionId);

    // Each call continued once by whichever live daemon claimed it; each was waiting on its model when A
    // died (nothing of unknown outcome), so no recovery attempt is charged.
    const runs = await db.pool.query(
      "select recovery_attempts, free_continuations from subagent_runs where parent_session_id = $1::uuid",
      [sessionId],
    );
    for (const r of runs.rows) expect(r).toEqual({ recovery_attempts: 0, free_continuations: 1 });
    const [tb, tc] = await Promise.all([takeoverOf(b), takeoverOf(c)]);
    expect(tb.delegations.continued + tc.delegations.continued).toBe(CHILDREN);
    expect(tb.workflows.resumed + tc.workflows.resumed).toBe(1);
    expect(tb.roots + tc.roots).toBeGreaterThanOrEqual(1);

    // The root's follow-up turn answered its results after A was gone: on the daemon that took them.
    await waitFor(async () => {
      const { rows } = await db.pool.query(
        `select count(*)::int as n from journal_entries
          where session_id = $1::uuid and role = 'assistant' and not discarded and created_at > $2`,
        [sessionId, killedAt],
      );
      return rows[0].n >= 1;
    }, "the root session's follow-up turn");
    // Given time to show up, no second delivery appears.
    await new Promise((r) => setTimeout(r, 1500));
    await assertDeliveredOnce(sessionId);
    for (const d of [b, c]) d.child.kill("SIGTERM");
    await Promise.all([b.exited, c.exited]);
  }, 180_000);

  it("a daemon that stops gracefully announces it, and a peer with a far-off sweep takes its work at once", async () => {
    released = new Promise<void>((r) => {
      release = r;
    });
    seen.clear();
    // D's periodic check is a minute away: only the release announcement can wake it in time.
    const [e, d] = await Promise.all([start("e", 300), start("d", 60_000)]);
    const { sessionId, workflowId } = await submit(e);
    await waitFor(() => seen.size === CHILDREN + 1, "the work to be in flight on E");
    e.child.kill("SIGTERM");
    await e.exited;
    release();
    await waitFor(
      async () => {
        const p = await progressOf(sessionId, workflowId);
        return p.ok === CHILDREN && p.workflow === "completed" && p.acks === CHILDREN + 1;
      },
      "D to finish and deliver all of E's work",
      45_000,
    );
    await assertDeliveredOnce(sessionId);
    const t = await takeoverOf(d);
    expect(t.releasesHeard).toBeGreaterThanOrEqual(1);
    expect(t.delegations.continued).toBe(CHILDREN);
    expect(t.workflows.resumed).toBe(1);
    d.child.kill("SIGTERM");
    await d.exited;
  }, 120_000);
});
