import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type EmbeddedCluster, startEmbeddedCluster } from "@crw/db";
import { type ModelReply, type ModelRequest, type ModelServer, startModelServer } from "@crw/tools/models";
import { useTestDatabase } from "@crw/tools/pg";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TestClient } from "./support/client.js";
import { type DaemonProcess, spawnDaemon } from "./support/process.js";
import { waitFor } from "./support/wait.js";
import { startTwoNodeWorkflow } from "./support/workflows.js";

/**
 * PostgreSQL lost and back, with no restart by hand: a daemon process drives a two-node workflow whose
 * first node's model call is held; the database server is SIGKILLed. The daemon's /health goes degraded
 * naming the cause, requests answer database_unavailable, and when the database answers again (the
 * daemon starts its embedded server itself; an external one is started again by the test) a new runtime
 * recovers the daemon's work: the workflow completes with exactly one summary in its parent's inbox.
 */
const db = useTestDatabase();
const KEY = "CRW_TEST_DBLOSS_KEY";
let models: ModelServer;
let release: () => void = () => {};
let released = new Promise<void>((r) => {
  release = r;
});
const seen = new Set<string>();
const made: string[] = [];
const daemons: DaemonProcess[] = [];

async function answer(request: ModelRequest): Promise<ModelReply> {
  const text = request.userTexts.join("\n");
  if (text.includes("[workflow summary")) return { text: "the parent read the summary" };
  const tag = /(NODE-\w+)/.exec(text)?.[1];
  if (!tag) return { text: "noted" };
  seen.add(tag);
  await released;
  return { text: `${tag} finished` };
}

beforeAll(async () => {
  models = await startModelServer(answer);
});

afterAll(async () => {
  release();
  for (const d of daemons) if (d.child.exitCode === null) d.child.kill("SIGKILL");
  await Promise.all(daemons.map((d) => d.exited));
  await models?.close();
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

const tmp = (name: string) => {
  const dir = mkdtempSync(join(tmpdir(), `crw-dbloss-${name}-`));
  made.push(dir);
  return dir;
};

async function daemonOn(dataDir: string, databaseUrl: string): Promise<DaemonProcess> {
  const d = await spawnDaemon({
    dataDir,
    databaseUrl,
    // While the database is lost the daemon probes it with a doubling wait, 5 s at most by default: each
    // failed /health read of the test probes at once and doubles it, so by the time the database is back
    // the next probe could be 5 s away. A 250 ms cap keeps every retry and finds it back within a beat.
    runtime: { maxRunners: 1, turnsPerRunner: 8, databaseRetryMaxMs: 250 },
    env: {
      CRW_MODEL: "openai-completions:loopback",
      CRW_MODEL_BASE_URL: models.openaiBaseUrl,
      CRW_MODEL_API_KEY_ENV: KEY,
      [KEY]: "secret",
    },
  });
  daemons.push(d);
  return d;
}

/** /health as the owner's token reads it (any status code). */
async function health(d: DaemonProcess): Promise<Record<string, unknown>> {
  const res = await fetch(`${d.url}/health`, { headers: { authorization: `Bearer ${d.token}` } });
  return (await res.json()) as Record<string, unknown>;
}

const postmasterPid = (pgData: string) =>
  Number(readFileSync(join(pgData, "postmaster.pid"), "utf8").split("\n")[0]);

async function startWorkflow(d: DaemonProcess): Promise<{ sessionId: string; workflowId: string }> {
  const client = await TestClient.connect(d.url, d.token);
  try {
    const { sessionId } = await client.ok<{ sessionId: string }>("session.create", {});
    const workflowId = await startTwoNodeWorkflow(client, sessionId, "db-loss");
    return { sessionId, workflowId };
  } finally {
    client.close();
  }
}

/** Lost, degraded with its cause, refusing requests; then back, with the work recovered. */
async function lostAndBack(d: DaemonProcess, kill: () => void, bringBack?: () => Promise<void>) {
  const client = await TestClient.connect(d.url, d.token);
  try {
    kill();
    await waitFor(async () => (await health(d)).status === "degraded", "health to say degraded", 20_000);
    const degraded = await health(d);
    expect(degraded.ok).toBe(false);
    expect(String((degraded.database as { error?: unknown }).error)).toMatch(/\S/);
    const refused = await client.call("session.status", {});
    expect((refused.error as { data: { code: string } }).data.code).toBe("database_unavailable");
    await bringBack?.();
    await waitFor(
      async () => (await health(d).catch((): Record<string, unknown> => ({}))).status === "ok",
      "health to say ok again",
      60_000,
    );
    const back = (await health(d)) as {
      database: { losses: number; restarts: number; recovery: { recoveries: number } };
    };
    expect(back.database.losses).toBeGreaterThanOrEqual(1);
    expect(back.database.recovery.recoveries).toBeGreaterThanOrEqual(1);
    return back;
  } finally {
    client.close();
  }
}

async function assertCompletedOnce(url: string, sessionId: string, workflowId: string) {
  const db = new pg.Client({ connectionString: url });
  await db.connect();
  try {
    await waitFor(
      async () =>
        (await db.query("select status from workflows where id = $1", [workflowId])).rows[0]?.status ===
        "completed",
      "the workflow to complete",
      60_000,
    );
    // the summary is handed to the parent after the workflow's own row says completed
    const summaries = () =>
      db.query(
        `select r.id, (select count(*)::int from journal_entries j
                        where j.session_id = $1::uuid and j.result_id = r.id and not j.discarded) as entries
           from delegation_results r where r.parent_session_id = $1::uuid and r.kind = 'workflow_summary'`,
        [sessionId],
      );
    await waitFor(
      async () => (await summaries()).rows.some((r) => r.entries > 0),
      "the summary to be delivered",
      30_000,
    );
    expect((await summaries()).rows.map((r) => r.entries)).toEqual([1]);
  } finally {
    await db.end();
  }
}

describe("the database lost and back", () => {
  it("an embedded PostgreSQL SIGKILLed mid-workflow is started again by the daemon, which recovers its work: the workflow completes with one summary, the daemon's connections through the server's socket again", async () => {
    const dataDir = tmp("embedded");
    const d = await daemonOn(dataDir, "");
    const pgData = join(dataDir, "postgres");
    try {
      const { sessionId, workflowId } = await startWorkflow(d);
      await waitFor(() => seen.has("NODE-one"), "the first node's model call", 30_000);
      const before = postmasterPid(pgData);
      const back = await lostAndBack(d, () => process.kill(before, "SIGKILL"));
      expect(back.database.restarts).toBeGreaterThanOrEqual(1);
      expect(postmasterPid(pgData)).not.toBe(before);
      release();
      const password = readFileSync(join(dataDir, "postgres.password"), "utf8").trim();
      const port = Number(readFileSync(join(pgData, "postmaster.pid"), "utf8").split("\n")[3]);
      const url = `postgres://crw:${encodeURIComponent(password)}@127.0.0.1:${port}/crw`;
      await assertCompletedOnce(url, sessionId, workflowId);
      // The daemon's connections, made again after the restart, come through the server's Unix socket
      // (no client address), never over TCP: this check's own connection is the only TCP one.
      const db = new pg.Client({ connectionString: url });
      await db.connect();
      try {
        const { rows } = await db.query<{ socket: number; tcp: number }>(
          `select count(*) filter (where client_addr is null)::int as socket,
                  count(*) filter (where client_addr is not null and pid <> pg_backend_pid())::int as tcp
             from pg_stat_activity where datname = 'crw' and backend_type = 'client backend'`,
        );
        expect(rows[0]?.socket).toBeGreaterThan(0);
        expect(rows[0]?.tcp).toBe(0);
      } finally {
        await db.end();
      }
    } finally {
      // a graceful stop ends the server the daemon started again; one left behind is ended here
      d.child.kill("SIGTERM");
      await d.exited;
      try {
        process.kill(postmasterPid(pgData), "SIGINT");
      } catch {}
    }
  }, 180_000);

  it("an external PostgreSQL SIGKILLed mid-workflow and started again by its operator: the daemon retries, recovers its work, and the workflow completes with one summary", async () => {
    released = new Promise<void>((r) => {
      release = r;
    });
    seen.clear();
    const pgDir = join(tmp("external-pg"), "data");
    const password = "external-secret";
    let cluster: EmbeddedCluster = await startEmbeddedCluster({
      dataDir: pgDir,
      persistent: true,
      user: "crw",
      password,
    });
    const url = cluster.url("postgres");
    const d = await daemonOn(tmp("external"), url);
    try {
      const { sessionId, workflowId } = await startWorkflow(d);
      await waitFor(() => seen.has("NODE-one"), "the first node's model call", 30_000);
      const pid = postmasterPid(pgDir);
      const back = await lostAndBack(
        d,
        () => process.kill(pid, "SIGKILL"),
        async () => {
          // the daemon never starts an external server: it stays degraded until the operator does
          await new Promise((r) => setTimeout(r, 1_500));
          expect((await health(d)).status).toBe("degraded");
          cluster = await startRetrying(() =>
            startEmbeddedCluster({
              dataDir: pgDir,
              persistent: true,
              user: "crw",
              password,
              port: cluster.port,
            }),
          );
        },
      );
      expect(back.database.restarts).toBe(0);
      release();
      await assertCompletedOnce(url, sessionId, workflowId);
    } finally {
      d.child.kill("SIGTERM");
      await d.exited;
      await cluster.stop();
    }
  }, 180_000);

  it("a daemon whose owner lease's connection is cut while the database stays up closes its runtime and recovers its work: the workflow completes with one summary", async () => {
    released = new Promise<void>((r) => {
      release = r;
    });
    seen.clear();
    const d = await daemonOn(tmp("lease"), db.url);
    try {
      const { sessionId, workflowId } = await startWorkflow(d);
      await waitFor(() => seen.has("NODE-one"), "the first node's model call", 30_000);
      // peers would now see this daemon dead and may claim its work: it must stop driving it
      const cut = await db.pool.query(
        `select pg_terminate_backend(pid) from pg_stat_activity
          where datname = current_database() and query like 'select pg_advisory_lock%'`,
      );
      expect(cut.rows.length).toBeGreaterThanOrEqual(1);
      await waitFor(
        async () =>
          ((await health(d)) as { database?: { recovery?: { recoveries?: number } } }).database?.recovery
            ?.recoveries === 1 && (await health(d)).status === "ok",
        "the daemon to recover its work on a new runtime",
        60_000,
      );
      release();
      await assertCompletedOnce(db.url, sessionId, workflowId);
    } finally {
      d.child.kill("SIGTERM");
      await d.exited;
    }
  }, 120_000);
});

/** A server whose killed processes still hold its shared memory refuses to start for a moment. */
async function startRetrying<T>(start: () => Promise<T>): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      return await start();
    } catch (e) {
      if (i > 40) throw e;
      await new Promise((r) => setTimeout(r, 250));
    }
  }
}
