import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TestClient } from "./support/client.js";
import { type DaemonProcess, spawnDaemon } from "./support/process.js";
import {
  allUserText,
  gate,
  type LoopbackProvider,
  lastUserText,
  type ProviderRequest,
  startLoopbackProvider,
} from "./support/provider.js";

/**
 * The restart checkpoint at process level: the built daemon as its own process, SIGTERM while a delegated
 * child's journal write is blocked in PostgreSQL (a test transaction holds the child's session row), a
 * loopback model provider, and a second daemon that continues the interrupted turn by boot recovery.
 */
const db = useTestDatabase();
const KEY_VAR = "CRW_TEST_LOOPBACK_KEY";
const MODEL = "openai-completions:loopback-m";
let provider: LoopbackProvider;
/** Per marker: the grandchild's answer waits on `grandchild`, the child's second request on `resume`. */
const gates = new Map<string, { grandchild: ReturnType<typeof gate>; resume: ReturnType<typeof gate> }>();
const daemons: DaemonProcess[] = [];

const hasToolResult = (r: ProviderRequest) => (r.body.messages ?? []).some((m) => m.role === "tool");

beforeAll(async () => {
  provider = await startLoopbackProvider(async (request) => {
    const text = allUserText(request);
    for (const [marker, g] of gates) {
      if (text.includes(`HELD-${marker}`)) {
        await g.resume.wait;
        return { text: `held ${marker} answered` };
      }
      if (text.includes(`GRAND-${marker}`)) {
        await g.grandchild.wait;
        return { text: `grandchild ${marker} done` };
      }
      if (text.includes(`CHILD-${marker}`)) {
        if (!hasToolResult(request))
          return {
            tool: {
              id: `call-${marker}`,
              name: "Delegate",
              arguments: { task: `GRAND-${marker} work`, background: false },
            },
          };
        await g.resume.wait;
        return { text: `child ${marker} resumed and done` };
      }
    }
    return { text: "ok" };
  });
});

afterAll(async () => {
  for (const g of gates.values()) {
    g.grandchild.open();
    g.resume.open();
  }
  for (const d of daemons)
    if (d.child.exitCode === null && d.child.signalCode === null) d.child.kill("SIGKILL");
  // Their data directories go after this file's tests (test/setup.ts): once the processes are gone.
  await Promise.all(daemons.map((d) => d.exited));
  await provider?.close();
});

const env = () => ({
  [KEY_VAR]: "loopback-secret",
  CRW_MODEL: MODEL,
  CRW_MODEL_BASE_URL: provider.baseUrl,
  CRW_MODEL_API_KEY_ENV: KEY_VAR,
});

async function start(
  dataDir: string,
  extra: Record<string, unknown> = {},
): Promise<{ daemon: DaemonProcess; client: TestClient }> {
  // A grace longer than any test: a stop that waited for a held model turn would never end here.
  writeFileSync(join(dataDir, "daemon.json"), JSON.stringify({ shutdownGraceMs: 600_000, ...extra }));
  const daemon = await spawnDaemon({
    dataDir,
    databaseUrl: db.url,
    env: env(),
    logLevel: "info",
    runtime: { maxRunners: 1, turnsPerRunner: 8 },
  });
  daemons.push(daemon);
  return { daemon, client: await TestClient.connect(daemon.url, daemon.token) };
}

const waitFor = async (check: () => boolean | Promise<boolean>, what: string, ms = 60_000) => {
  const until = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
};

/**
 * Starts a child (on the loopback model) whose Delegate tool call finishes while the test holds the child's
 * session row, so the child's tool-result journal write is captured and blocked when SIGTERM arrives.
 */
async function childWithBlockedToolResult(marker: string, client: TestClient) {
  gates.set(marker, { grandchild: gate(), resume: gate() });
  const g = gates.get(marker) as NonNullable<ReturnType<typeof gates.get>>;
  const { sessionId: parent } = await client.ok<{ sessionId: string }>("session.create", {
    model: "scripted",
  });
  const receipt = await client.ok<{ kind: string; runId: string; childSessionId: string }>(
    "session.delegate",
    {
      sessionId: parent,
      task: `CHILD-${marker} work`,
      model: MODEL,
      background: true,
    },
  );
  expect(receipt.kind).toBe("started");
  await waitFor(
    () => provider.requests.some((r) => lastUserText(r).includes(`GRAND-${marker}`)),
    "the grandchild's model request",
  );
  // Hold the child's session row: its next journal append (the Delegate tool result) waits on it.
  const holder = new pg.Client({ connectionString: db.url });
  await holder.connect();
  await holder.query("begin");
  await holder.query("select id from sessions where id = $1 for no key update", [receipt.childSessionId]);
  g.grandchild.open();
  const blocked = async () =>
    (
      await db.pool.query(
        `select pid from pg_stat_activity
          where datname = current_database() and wait_event_type = 'Lock' and pid <> $1`,
        [(await holder.query("select pg_backend_pid() as pid")).rows[0].pid],
      )
    ).rows.map((r) => r.pid as number);
  await waitFor(async () => (await blocked()).length > 0, "the child's tool result write to block");
  return { parent, child: receipt.childSessionId, runId: receipt.runId, holder, blocked, gates: g };
}

const logIndex = (d: DaemonProcess, msg: string | RegExp) =>
  d.logs().findIndex((l) => (typeof msg === "string" ? l.msg === msg : msg.test(String(l.msg))));

describe("the restart checkpoint on daemon exit", { timeout: 120_000 }, () => {
  it("SIGTERM: the finished tool result queued behind the in-flight write commits before the pool closes; the held model turn is not waited for and boot recovery continues it (S004-136 S004-138)", async () => {
    const dataDir = scratchDir("crw-daemon-checkpoint-");
    const first = await start(dataDir);
    const c = await childWithBlockedToolResult("CP", first.client);
    first.client.close();

    first.daemon.child.kill("SIGTERM");
    await waitFor(() => logIndex(first.daemon, "daemon stopping") >= 0, "the stop to begin");
    // The checkpoint waits for the captured write: the process has not exited while the write is blocked.
    await new Promise((r) => setTimeout(r, 300));
    expect(first.daemon.child.exitCode).toBeNull();
    expect(logIndex(first.daemon, "shutdown checkpoint passed")).toBe(-1);
    await c.holder.query("commit");
    await c.holder.end();

    // The child's next model request is held (resume gate closed) for the whole stop: the exit does not wait.
    expect(await first.daemon.exited).toBe("0");
    const passed = logIndex(first.daemon, "shutdown checkpoint passed");
    expect(passed).toBeGreaterThanOrEqual(0);
    expect(passed).toBeLessThan(logIndex(first.daemon, "runner pool closed"));
    // The finished tool result is in the child's journal, settled.
    const { rows } = await db.pool.query(
      `select count(*)::int as n from journal_entries
        where session_id = $1 and role = 'toolResult' and settled and tool_call_id = 'call-CP'`,
      [c.child],
    );
    expect(rows[0].n).toBe(1);
    const open = await db.pool.query("select status from subagent_runs where id = $1", [c.runId]);
    expect(open.rows[0].status).toMatch(/^(running|settling)$/);

    // A new daemon continues the child's turn from its journal: the model sees the tool result and answers.
    c.gates.resume.open();
    const second = await start(dataDir);
    try {
      await waitFor(async () => {
        const read = await second.client.ok<{ messages: { text: string }[] }>("session.read", {
          sessionId: c.parent,
        });
        return read.messages.some((m) => m.text.includes("child CP resumed and done"));
      }, "the continued child's result at its parent");
      const continued = provider.requests.filter(
        (r) => allUserText(r).includes("CHILD-CP") && hasToolResult(r),
      );
      expect(continued.length).toBeGreaterThanOrEqual(1);
    } finally {
      second.client.close();
      second.daemon.child.kill("SIGTERM");
      expect(await second.daemon.exited).toBe("0");
    }
  });

  it("SIGTERM while a child's model request is held: the checkpoint does not wait for the turn; the run stays open (S004-137)", async () => {
    const dataDir = scratchDir("crw-daemon-checkpoint-held-");
    const first = await start(dataDir);
    gates.set("M", { grandchild: gate(), resume: gate() });
    const { sessionId: parent } = await first.client.ok<{ sessionId: string }>("session.create", {
      model: "scripted",
    });
    const receipt = await first.client.ok<{ runId: string }>("session.delegate", {
      sessionId: parent,
      task: "HELD-M work",
      model: MODEL,
      background: true,
    });
    await waitFor(
      () => provider.requests.some((r) => allUserText(r).includes("HELD-M")),
      "the child's model request",
    );
    first.client.close();
    first.daemon.child.kill("SIGTERM");
    // The model never answers while this daemon lives: the exit does not depend on it.
    expect(await first.daemon.exited).toBe("0");
    expect(logIndex(first.daemon, "shutdown checkpoint passed")).toBeGreaterThanOrEqual(0);
    const { rows } = await db.pool.query("select status from subagent_runs where id = $1", [receipt.runId]);
    expect(rows[0].status).toBe("running");
  });

  it("a checkpoint whose captured write fails logs the shutdown failure and the process exits nonzero (S004-139)", async () => {
    const dataDir = scratchDir("crw-daemon-checkpoint-fail-");
    const first = await start(dataDir);
    const c = await childWithBlockedToolResult("FAIL", first.client);
    first.client.close();
    first.daemon.child.kill("SIGTERM");
    await waitFor(() => logIndex(first.daemon, "daemon stopping") >= 0, "the stop to begin");
    // The blocked write's connection is ended by the server: the captured write fails.
    for (const pid of await c.blocked()) await db.pool.query("select pg_terminate_backend($1)", [pid]);
    expect(await first.daemon.exited).toBe("1");
    await c.holder.query("rollback");
    await c.holder.end();
    const failed = first.daemon.logs().find((l) => /^shutdown failed/.test(String(l.msg)));
    expect(failed).toMatchObject({ level: 50 });
    expect(logIndex(first.daemon, "shutdown checkpoint passed")).toBe(-1);
  });

  it("a checkpoint write blocked past shutdownCheckpointMs: the stop logs the failure naming the pending write, exits nonzero, and the next boot recovers the run (S004-139)", async () => {
    const dataDir = scratchDir("crw-daemon-checkpoint-deadline-");
    // Past the deadline the runtime's close waits on its blocked database pool for abandonedCloseMs
    // (5 s by default) before the process ends: a second here, the same stop sooner.
    const first = await start(dataDir, { shutdownCheckpointMs: 1_500, abandonedCloseMs: 1_000 });
    const c = await childWithBlockedToolResult("DL", first.client);
    first.client.close();
    first.daemon.child.kill("SIGTERM");
    // The write stays blocked for good (the holder never lets go while this daemon lives): the deadline
    // ends the stop, not the write.
    expect(await first.daemon.exited).toBe("1");
    expect(logIndex(first.daemon, "shutdown checkpoint passed")).toBe(-1);
    const failed = first.daemon.logs().find((l) => /^shutdown failed/.test(String(l.msg)));
    expect(failed).toMatchObject({ level: 50, deadlineMs: 1_500 });
    expect(String(failed?.msg)).toContain("did not finish within 1500 ms");
    // It names the blocked journal write: the grandchild's result delivered into the child's session.
    const pending = failed?.pending as { call: string; sessionId: string | null; sinceMs: number }[];
    const write = pending.find((p) => p.sessionId === c.child);
    expect(write?.call).toMatch(/^(deliverResults|append)$/);
    expect(write?.sinceMs).toBeGreaterThanOrEqual(1_000);
    expect(String(failed?.msg)).toContain(`${write?.call} (session ${c.child})`);
    expect(first.daemon.logs().some((l) => l.msg === "daemon stopped")).toBe(true);

    // Nothing committed is lost: the lock goes, the next daemon boots and its recovery takes the open run.
    await c.holder.query("rollback");
    await c.holder.end();
    c.gates.resume.open();
    const second = await start(dataDir);
    try {
      const health = await second.client.ok<{
        recovery: {
          delegations: { continued: string[]; settledWithoutTurn: string[]; terminalized: string[] };
        };
      }>("daemon.health");
      const d = health.recovery.delegations;
      expect([...d.continued, ...d.settledWithoutTurn, ...d.terminalized]).toContain(c.runId);
      const journal = await db.pool.query(
        "select count(*)::int as n from journal_entries where session_id = $1 and role = 'assistant'",
        [c.child],
      );
      expect(journal.rows[0].n).toBeGreaterThanOrEqual(1);
    } finally {
      second.client.close();
      second.daemon.child.kill("SIGTERM");
      expect(await second.daemon.exited).toBe("0");
    }
  });
});
