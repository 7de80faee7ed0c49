import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { captureDelegatedExecutionScope } from "@crw/brain";
import { announceWatches, JOURNAL_WAKE_CHANNEL, PgDelegationRepository } from "@crw/db";
import { PgWorkflowStore } from "@crw/plugin-subagent";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import pg from "pg";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Daemon, loadConfig, ownerTokenPath, startDaemon } from "../src/index.js";
import { TestClient } from "./support/client.js";

// session.tap, workflow.follow and a client's session.take wake on commits, not on a timer. The hub's
// fallback bound is set to a minute here, so a row reaches the view within the asserted time only through a
// wake: a write of another process (here another pool's connection, as another daemon's) only through
// PostgreSQL NOTIFY and the daemon's wake listener.
const silent = pino({ level: "silent" });
const db = useTestDatabase();
const FALLBACK_MS = 60_000;
const PROMPT_MS = 1_000;
let daemon: Daemon;
let client: TestClient;
let elsewhere: pg.Pool;
let unwatchedAtBoot: boolean | undefined;

beforeAll(async () => {
  const dataDir = scratchDir("crw-daemon-tapwake-");
  daemon = await startDaemon(
    loadConfig({
      env: { DATABASE_URL: db.url },
      overrides: { dataDir, port: 0, runtime: { maxRunners: 1, turnsPerRunner: 2 } },
    }),
    { log: silent },
  );
  daemon.runtime.wake.fallbackMs = FALLBACK_MS;
  // The boot found no other daemon on the database: its writes notify only announced views at once.
  unwatchedAtBoot = daemon.runtime.wake.isWatched(`journal:${randomUUID()}`);
  client = await TestClient.connect(daemon.state.url, readFileSync(ownerTokenPath(dataDir), "utf8").trim());
  elsewhere = new pg.Pool({ connectionString: db.url, max: 2 });
});
afterAll(async () => {
  client?.close();
  await daemon?.stop();
  await elsewhere?.end();
});

const until = async (what: string, ok: () => boolean, ms: number) => {
  const deadline = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 2));
  }
};

const tapped = (sessionId: string, seq: number) =>
  client.notifications.some(
    (n) =>
      n.method === "session.tap" &&
      n.params.sessionId === sessionId &&
      (n.params.message as { seq?: number } | undefined)?.seq === seq,
  );

async function openTap(): Promise<{ sessionId: string; accountId: string }> {
  const { sessionId } = await client.ok<{ sessionId: string }>("session.create");
  const { rows } = await db.pool.query<{ a: string }>(
    "select principal_account_id::text as a from sessions where id = $1::uuid",
    [sessionId],
  );
  const accountId = rows[0]?.a ?? "";
  const watching = daemon.runtime.wake.watchCount;
  void client.call("session.tap", { sessionId });
  // The tap has read once and waits; the listener is in place (its first LISTEN wakes every view once).
  await until("tap waiting", () => daemon.runtime.wake.watchCount > watching, 10_000);
  await until("wake listener", () => daemon.runtime.wake.counts.listens > 0, 10_000);
  await new Promise((r) => setTimeout(r, 50));
  return { sessionId, accountId };
}

const row = (text: string) => ({
  body: { type: "message" as const, message: { role: "user" as const, content: text } },
});

describe("session.tap wakes on commits", () => {
  it("a row appended by another connection (another process's write) reaches the tap through NOTIFY, long before the fallback bound", async () => {
    const { sessionId, accountId } = await openTap();
    const other = new PgDelegationRepository(elsewhere);
    const notificationsBefore = daemon.runtime.wake.counts.notifications;
    for (let i = 0; i < 5; i++) {
      const [entry] = await other.append(sessionId, accountId, [row(`from elsewhere ${i}`)]);
      const seq = entry?.seq ?? -1;
      const t0 = performance.now();
      await until(`row ${seq} tapped`, () => tapped(sessionId, seq), PROMPT_MS);
      expect(performance.now() - t0).toBeLessThan(PROMPT_MS);
    }
    // Woken by the notifications (one per append), not by the in-process path (another pool's writes).
    expect(daemon.runtime.wake.counts.notifications - notificationsBefore).toBeGreaterThanOrEqual(5);
  });

  it("a row appended by this daemon wakes the tap directly", async () => {
    const { sessionId, accountId } = await openTap();
    const [entry] = await daemon.runtime.repo.append(sessionId, accountId, [row("from here")]);
    await until("row tapped", () => tapped(sessionId, entry?.seq ?? -1), PROMPT_MS);
  });

  it("rows settled from provisional wake the tap (their seqs were already notified while invisible)", async () => {
    const { sessionId, accountId } = await openTap();
    const other = new PgDelegationRepository(elsewhere);
    const [entry] = await other.append(sessionId, accountId, [{ ...row("provisional"), settled: false }]);
    await new Promise((r) => setTimeout(r, 100));
    expect(tapped(sessionId, entry?.seq ?? -1)).toBe(false);
    expect(await other.settleProvisional(sessionId, accountId, "settled")).toBe(1);
    await until("settled row tapped", () => tapped(sessionId, entry?.seq ?? -1), PROMPT_MS);
  });

  it("a daemon alone on its database notifies no unwatched journal from the end of its boot, not a second later", () => {
    expect(unwatchedAtBoot).toBe(false);
  });

  it("a write notifies only a journal some process watches: unwatched appends send none, another daemon's announced view gets them", async () => {
    const { sessionId } = await client.ok<{ sessionId: string }>("session.create");
    const { rows } = await db.pool.query<{ a: string }>(
      "select principal_account_id::text as a from sessions where id = $1::uuid",
      [sessionId],
    );
    const accountId = rows[0]?.a ?? "";
    const heard: string[] = [];
    const listener = await elsewhere.connect();
    try {
      listener.on("notification", (n) => {
        if (n.channel === JOURNAL_WAKE_CHANNEL && n.payload?.startsWith(sessionId)) heard.push(n.payload);
      });
      await listener.query(`listen ${JOURNAL_WAKE_CHANNEL}`);
      // Past the daemon's relearning window after its listener came up (it notifies everything meanwhile).
      await until("wake listener", () => daemon.runtime.wake.counts.listens > 0, 10_000);
      await new Promise((r) => setTimeout(r, 1_100));
      await daemon.runtime.repo.append(sessionId, accountId, [row("nobody watches")]);
      await new Promise((r) => setTimeout(r, 100));
      expect(heard).toEqual([]);
      // Another daemon opens a view of this journal: its announcement reaches this daemon's listener.
      await announceWatches(elsewhere, [`journal:${sessionId}`]);
      await until("announcement heard", () => daemon.runtime.wake.isWatched(`journal:${sessionId}`), 2_000);
      const [entry] = await daemon.runtime.repo.append(sessionId, accountId, [row("someone watches")]);
      await until("notified", () => heard.includes(`${sessionId}:${entry?.seq}`), PROMPT_MS);
    } finally {
      await listener.query(`unlisten ${JOURNAL_WAKE_CHANNEL}`).catch(() => undefined);
      listener.release();
    }
  });

  it("workflow.follow reports a node state another daemon publishes through NOTIFY, long before the fallback bound", async () => {
    const { sessionId } = await client.ok<{ sessionId: string }>("session.create");
    const { rows } = await db.pool.query<{ a: string }>(
      "select principal_account_id::text as a from sessions where id = $1::uuid",
      [sessionId],
    );
    const store = new PgWorkflowStore(elsewhere);
    const workflowId = randomUUID();
    const owner = `another-daemon-${randomUUID()}-workflows`;
    // A live owner: this daemon's takeover sweep leaves the workflow to it.
    const letGo = await new PgDelegationRepository(elsewhere).holdOwnerLease(owner);
    try {
      await store.insertWorkflow({
        id: workflowId,
        parentSessionId: sessionId,
        principalAccountId: rows[0]?.a ?? "",
        toolCallId: "follow-wake",
        name: "elsewhere",
        snapshot: { nodes: [{ id: "a", status: "pending" }] },
        owner,
      });
      const generation = (await store.getWorkflow(workflowId))?.recovery.workflowGeneration ?? 0;
      const watching = daemon.runtime.wake.watchCount;
      void client.call("workflow.follow", { workflowId });
      await until("follow waiting", () => daemon.runtime.wake.watchCount > watching, 10_000);
      const progressed = (status: string) =>
        client.notifications.some(
          (n) =>
            n.method === "workflow.progress" &&
            n.params.workflowId === workflowId &&
            n.params.nodeId === "a" &&
            n.params.status === status,
        );
      // the follow's first look, after its watch opened, reports the state as it is
      await until("the first state", () => progressed("pending"), 10_000);
      for (const status of ["running", "succeeded"]) {
        expect(
          await store.publishSnapshot(
            workflowId,
            { nodes: [{ id: "a", status }] },
            "running",
            generation,
            owner,
          ),
        ).toBe("updated");
        await until(`node a ${status}`, () => progressed(status), PROMPT_MS);
      }
    } finally {
      await letGo();
    }
  });
});

async function clientSession(): Promise<{ sessionId: string; accountId: string }> {
  const { sessionId } = await client.ok<{ sessionId: string }>("session.open", { name: randomUUID() });
  const { rows } = await db.pool.query<{ a: string }>(
    "select principal_account_id::text as a from sessions where id = $1::uuid",
    [sessionId],
  );
  return { sessionId, accountId: rows[0]?.a ?? "" };
}

/** A child's result settled into `sessionId`'s inbox by `repo`, returning its id. */
async function settleInto(
  repo: PgDelegationRepository,
  sessionId: string,
  accountId: string,
  wakeFor: string = sessionId,
): Promise<string> {
  const { run } = await repo.createDelegation({
    parentSessionId: sessionId,
    principalAccountId: accountId,
    toolCallId: `call-${randomUUID()}`,
    task: "work",
    mode: "background",
    model: "scripted",
    scope: JSON.stringify(captureDelegatedExecutionScope({ accountId, target: { kind: "host", ref: null } })),
  });
  const resultId = randomUUID();
  const settled = await repo.settleRun({
    runId: run.id,
    generation: run.generation,
    resultId,
    outcome: "ok",
    body: `answer ${resultId}`,
    byteSize: 43,
    parentSessionId: wakeFor,
  });
  expect(settled.settled).toBe(true);
  return resultId;
}

/** A take waiting for the next result: resolves with the ids it answered and when. */
async function waitingTake(sessionId: string) {
  const watching = daemon.runtime.wake.watchCount;
  const answered = client
    .ok<{ results: Array<{ resultId: string }> }>("session.take", { sessionId, waitSeconds: 30 })
    .then((r) => ({ ids: r.results.map((x) => x.resultId), at: performance.now() }));
  // The take has looked once and waits; the listener is in place.
  await until("take waiting", () => daemon.runtime.wake.watchCount > watching, 10_000);
  await until("wake listener", () => daemon.runtime.wake.counts.listens > 0, 10_000);
  return answered;
}

describe("a client's take waiting for a result wakes on its commit", () => {
  it("a result another process settles reaches the waiting take through NOTIFY; the take does not look again meanwhile", async () => {
    const { sessionId, accountId } = await clientSession();
    const other = new PgDelegationRepository(elsewhere);
    // Each look of a take at the inbox is one delivery of what waits there.
    const repo = daemon.runtime.service.repo;
    const deliver = repo.deliverQueuedResults;
    let looks = 0;
    repo.deliverQueuedResults = (id, ...rest) => {
      if (id === sessionId) looks += 1;
      return deliver.call(repo, id, ...rest);
    };
    try {
      const notificationsBefore = daemon.runtime.wake.counts.notifications;
      for (let i = 0; i < 2; i++) {
        const looksBefore = looks;
        const take = waitingTake(sessionId);
        // Longer than two rechecks of a take that polled: one look, then a wait with none.
        await new Promise((r) => setTimeout(r, 1_200));
        expect(looks - looksBefore).toBe(1);
        const resultId = await settleInto(other, sessionId, accountId);
        const committedAt = performance.now();
        const answer = await take;
        expect(answer.ids).toEqual([resultId]);
        expect(answer.at - committedAt).toBeLessThan(PROMPT_MS);
        expect(looks - looksBefore).toBe(2);
      }
      // Woken by the notifications (one per result), not by this process's own settlements.
      expect(daemon.runtime.wake.counts.notifications - notificationsBefore).toBeGreaterThanOrEqual(2);
    } finally {
      repo.deliverQueuedResults = deliver;
    }
  });

  it("a result this daemon queues wakes the waiting take directly, without a notification", async () => {
    // Past the daemon's relearning window after its listener came up (it notifies everything meanwhile).
    await until("wake listener", () => daemon.runtime.wake.counts.listens > 0, 10_000);
    await new Promise((r) => setTimeout(r, 1_100));
    const { sessionId, accountId } = await clientSession();
    const take = waitingTake(sessionId);
    await new Promise((r) => setTimeout(r, 50));
    // Settled naming another inbox, so no NOTIFY is sent for this one: only the in-process path can wake it.
    const resultId = await settleInto(
      new PgDelegationRepository(elsewhere),
      sessionId,
      accountId,
      randomUUID(),
    );
    const notificationsBefore = daemon.runtime.wake.counts.notifications;
    const queuedAt = performance.now();
    await daemon.runtime.service.resultQueued(sessionId, accountId, resultId);
    const answer = await take;
    expect(answer.ids).toEqual([resultId]);
    expect(answer.at - queuedAt).toBeLessThan(PROMPT_MS);
    expect(daemon.runtime.wake.counts.notifications).toBe(notificationsBefore);
  });
});
