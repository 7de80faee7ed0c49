import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { createDatabase, dropDatabase, uniqueDatabaseName, useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import fc from "fast-check";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import WebSocket from "ws";
import { type Daemon, loadConfig, ownerTokenPath, startDaemon } from "../src/index.js";
import { TestClient } from "./support/client.js";
import { deep, deepText, frameArb, json, mixed, paramsFrameArb, SAFE_DEPTH } from "./support/fuzzFrames.js";
import {
  BATCH,
  closeLanes,
  keyOf,
  Lane,
  laneCounts,
  runBatch,
  runKeyed,
  samples,
  sleep,
  successes,
  tally,
  world,
} from "./support/fuzzLanes.js";
import { spawnDaemon } from "./support/process.js";

/**
 * Fuzzing the daemon's API over real WebSocket connections: arbitrary frames (JSON values, JSON-RPC shaped
 * requests with arbitrary ids, methods and params, non-JSON text, binary frames, deep nesting, long strings)
 * and, per registered method, params near its valid shape. Sent by an ordinary account and by an
 * administrator, never by the owner, whose sessions and workflows exist before the run.
 *
 * Properties: a frame with a string or number id gets exactly one reply, with that id, holding a result
 * or a typed error (`data.code` a snake_case string, never a SQLSTATE, `data.name` never the driver's
 * "error"; never `internal`); any other frame gets one reply with id null, or none for a notification;
 * no reply to another account quotes an id of the owner's sessions or workflows it was not sent; the daemon
 * stays healthy; afterwards no workflow is `running` without a driver, and the only sessions the fuzzing
 * accounts gained are those their successful requests made.
 */
const RUNS = Number(process.env.CRW_FUZZ_RUNS ?? 10_000);

const silent = pino({ level: "silent" });
const db = useTestDatabase();
let daemon: Daemon;
let ownerToken: string;
let owner: TestClient;
const { who, ownerIds, ownIds } = world;

async function newAccount(name: string, administrator: boolean) {
  const account = await daemon.runtime.repo.createAccount({ name, isAdministrator: administrator });
  const token = `crw_${randomBytes(18).toString("base64url")}`;
  await daemon.runtime.repo.addApiToken(account.id, createHash("sha256").update(token).digest(), "fuzz");
  return { accountId: account.id, token };
}

beforeAll(async () => {
  const dataDir = scratchDir("crw-daemon-fuzz-");
  const projectDir = scratchDir("crw-daemon-fuzz-project-");
  world.projectDir = projectDir;
  daemon = await startDaemon(
    loadConfig({
      env: { DATABASE_URL: db.url },
      overrides: { dataDir, port: 0, runtime: { maxRunners: 1, turnsPerRunner: 8 } },
    }),
    { log: silent },
  );
  world.url = daemon.state.url;
  world.methods = daemon.rpc.names();
  ownerToken = readFileSync(ownerTokenPath(dataDir), "utf8").trim();
  owner = await TestClient.connect(daemon.state.url, ownerToken);
  who.owner = {
    accountId: (await owner.ok<{ accountId: string }>("daemon.whoami")).accountId,
    token: ownerToken,
  };
  who.other = await newAccount("someone-else", false);
  who.admin = await newAccount("fuzz-admin", true);
  // The owner's work: sessions, a finished workflow (with its node's child session) and its ids.
  for (let i = 0; i < 3; i++)
    ownerIds.add((await owner.ok<{ sessionId: string }>("session.create")).sessionId);
  for (let i = 0; i < 2; i++) {
    const started = await owner.ok<{ workflowId: string; sessionId: string }>("workflow.start", {
      format: "json",
      definition: JSON.stringify({ name: `owner-${i}`, nodes: [{ id: "a", task: "t" }] }),
    });
    ownerIds.add(started.workflowId).add(started.sessionId);
    const done = await owner.ok<{ status: string; nodes: { childSessionId?: string }[] }>("workflow.follow", {
      workflowId: started.workflowId,
    });
    expect(done.status).toBe("completed");
    for (const n of done.nodes) if (n.childSessionId) ownerIds.add(n.childSessionId);
  }
  const { rows } = await db.pool.query("select id from sessions where principal_account_id = $1", [
    who.owner.accountId,
  ]);
  for (const r of rows) ownerIds.add(r.id as string);
  for (const [key, acct] of [
    ["otherSessions", who.other],
    ["adminSessions", who.admin],
  ] as const) {
    const c = await TestClient.connect(daemon.state.url, acct.token);
    for (let i = 0; i < 2; i++)
      ownIds[key].push((await c.ok<{ sessionId: string }>("session.create")).sessionId);
    c.close();
  }
}, 120_000);
afterAll(async () => {
  owner?.close();
  await daemon?.stop();
});

// ---- the suite --------------------------------------------------------------------------------------------

const countRows = async (sql: string, params: unknown[] = []) =>
  (await db.pool.query(sql, params)).rows[0].n as number;
const journalRows = (accountId: string) =>
  countRows(
    "select count(*)::int as n from journal_entries j join sessions s on s.id = j.session_id where s.principal_account_id = $1",
    [accountId],
  );

/** Until the account's journal rows stop growing for a second (bounded by 15 s). */
async function settledJournal(accountId: string): Promise<void> {
  const until = Date.now() + 15_000;
  let seen = await journalRows(accountId);
  for (let quietSince = Date.now(); Date.now() - quietSince < 1_000 && Date.now() < until; ) {
    await new Promise((r) => setTimeout(r, 100));
    const now = await journalRows(accountId);
    if (now !== seen) {
      seen = now;
      quietSince = Date.now();
    }
  }
}
const rootSessions = (accountId: string) =>
  countRows("select count(*)::int as n from sessions where principal_account_id = $1 and kind = 'root'", [
    accountId,
  ]);

describe("fuzzing the daemon's API frames", () => {
  let before: { other: number; admin: number; ownerJournal: number; ownerSessions: number };

  it("setup: the owner's work exists and every registered method is known", async () => {
    expect(world.methods.length).toBeGreaterThan(10);
    expect(ownerIds.size).toBeGreaterThanOrEqual(7);
    // The owner's workflows delivered their summaries into its sessions, and those sessions answer them
    // in follow-up turns after workflow.follow has seen the workflow complete: the counts below are taken
    // once that work has settled (no new journal row for a second).
    await daemon.runtime.service.whenIdle();
    await settledJournal(who.owner.accountId);
    before = {
      other: await rootSessions(who.other.accountId),
      admin: await rootSessions(who.admin.accountId),
      ownerJournal: await journalRows(who.owner.accountId),
      ownerSessions: await countRows(
        "select count(*)::int as n from sessions where principal_account_id = $1",
        [who.owner.accountId],
      ),
    };
  });

  it(`arbitrary frames get one typed reply each, leak nothing and crash nothing (${RUNS} frames)`, async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(mixed(frameArb), { minLength: BATCH, maxLength: BATCH }), async (frames) => {
        const problems = await runBatch(frames);
        expect(problems.slice(0, 5)).toEqual([]);
      }),
      { numRuns: Math.ceil(RUNS / BATCH), endOnFailure: true },
    );
  }, 300_000);

  it(`params near each method's shape get a result or a typed error, never internal (${RUNS} cases)`, async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(mixed(paramsFrameArb), { minLength: BATCH, maxLength: BATCH }),
        async (frames) => {
          const problems = await runBatch(frames);
          expect(problems.slice(0, 5)).toEqual([]);
        },
      ),
      { numRuns: Math.ceil(RUNS / BATCH), endOnFailure: true },
    );
  }, 300_000);

  it("afterwards the daemon is healthy, no workflow is running without a driver, and no failed request left a session", async () => {
    closeLanes();
    const res = await fetch(`${daemon.state.url}/health`, { signal: AbortSignal.timeout(5_000) });
    expect(res.status).toBe(200);
    expect(await owner.ok("daemon.whoami")).toMatchObject({ accountId: who.owner.accountId });
    const other = await TestClient.connect(daemon.state.url, who.other.token);
    expect(await other.ok("daemon.whoami")).toMatchObject({ accountId: who.other.accountId });
    other.close();
    expect(
      await countRows(
        "select count(*)::int as n from workflows where status = 'running' and locked_by is null",
      ),
    ).toBe(0);
    // No workflow.start of the fuzzing accounts could succeed (their definitions are all refused).
    expect(
      await countRows(
        "select count(*)::int as n from workflows where principal_account_id = any($1::uuid[])",
        [[who.other.accountId, who.admin.accountId]],
      ),
    ).toBe(0);
    // Their root sessions are exactly those their successful session.create calls made.
    expect((await rootSessions(who.other.accountId)) - before.other).toBe(successes.other);
    expect((await rootSessions(who.admin.accountId)) - before.admin).toBe(successes.admin);
    // The owner's rows were not touched by anyone else.
    expect(
      await countRows("select count(*)::int as n from sessions where principal_account_id = $1", [
        who.owner.accountId,
      ]),
    ).toBe(before.ownerSessions);
    expect(await journalRows(who.owner.accountId)).toBe(before.ownerJournal);
    if (process.env.CRW_FUZZ_SAMPLES)
      for (const [k, v] of samples)
        if (!/invalid_params|invalid_request|method_not_found/.test(k)) console.info(`${k}: ${v}`);
    const top = [...tally].filter(([k]) => !k.startsWith("?")).sort((a, b) => b[1] - a[1]);
    console.info(
      `fuzz-frames: frames ${JSON.stringify(laneCounts)}; replies by method and outcome: ${JSON.stringify(Object.fromEntries(top))}`,
    );
    console.info(
      `fuzz-frames: sessions made by successful requests: other ${successes.other}, admin ${successes.admin}`,
    );
  });

  it("a text frame of invalid UTF-8 closes only its own connection (1007); a frame over 4 MiB closes its own (1009)", async () => {
    for (const [payload, code] of [
      [Buffer.from([0x7b, 0xff, 0xfe, 0x7d]), 1007],
      [Buffer.alloc(4 * 1024 * 1024 + 16, 0x20), 1009],
    ] as const) {
      const lane = await Lane.open("other");
      lane.ws.send(payload, { binary: false });
      const deadline = Date.now() + 10_000;
      while (!lane.closed && Date.now() < deadline) await sleep(20);
      expect(lane.closed?.code).toBe(code);
    }
    expect(await owner.ok("daemon.whoami")).toMatchObject({ accountId: who.owner.accountId });
  });
});

describe("regressions the frame fuzz found", () => {
  /**
   * Params nested 10,000 deep (a 20 KB frame) once overflowed the stack in the U+0000 check, before any
   * handler ran, and the rejection ended the daemon process. Any authenticated account could send it, so
   * the case runs against a real daemon process.
   */
  it("an ordinary account's request whose params nest 10,000 deep gets a typed reply and the daemon process lives", async () => {
    const name = uniqueDatabaseName("crw_fz");
    const url = await createDatabase(db.adminUrl, name, inject("crwPgTemplate"));
    const dataDir = scratchDir("crw-daemon-fuzz-proc-");
    const proc = await spawnDaemon({ dataDir, databaseUrl: url, runtime: { maxRunners: 1 } });
    try {
      // An ordinary account, made through the API.
      const admin = await TestClient.connect(proc.url, proc.token);
      await admin.ok("account.create", { name: "plain" });
      const { token } = await admin.ok<{ token: string }>("token.issue", { account: "plain" });
      admin.close();
      const ws = new WebSocket(`${proc.url.replace("http", "ws")}/rpc`, {
        headers: { authorization: `Bearer ${token}` },
      });
      await new Promise((resolve, reject) => {
        ws.once("open", resolve);
        ws.once("error", reject);
      });
      const reply = new Promise<string | undefined>((resolve) => {
        ws.once("message", (m) => resolve(m.toString()));
        ws.once("close", () => resolve(undefined));
        setTimeout(() => resolve(undefined), 5_000);
      });
      // written as text: JSON.stringify of the value would overflow this process's stack too
      ws.send(`{"jsonrpc":"2.0","id":7,"method":"daemon.whoami","params":{"a":${deepText(10_000)}}}`);
      const text = await reply;
      const exited = await Promise.race([proc.exited, sleep(1_000).then(() => undefined)]);
      ws.close();
      expect(
        exited,
        `daemon process exited: ${proc
          .stderr()
          .split("\n")
          .find((l) => /RangeError/.test(l))}`,
      ).toBeUndefined();
      expect(text).toBeDefined();
      expect(JSON.parse(text as string)).toMatchObject({
        id: 7,
        error: { data: { code: expect.any(String) } },
      });
    } finally {
      proc.child.kill("SIGKILL");
      await proc.exited;
      await dropDatabase(db.adminUrl, name).catch(() => {});
    }
  }, 90_000);

  it(`params nested up to ${SAFE_DEPTH} deep are answered (the bound the fuzz keeps below the bug above)`, async () => {
    const lane = await Lane.open("other");
    try {
      const problems: string[] = [];
      const frames = [10, SAFE_DEPTH].map((d, i) => {
        const text = json({
          jsonrpc: "2.0",
          id: 515_000 + i,
          method: "daemon.whoami",
          params: { a: deep(d) },
        });
        return { f: { account: "other" as const, text }, key: keyOf(515_000 + i) };
      });
      await runKeyed(lane, frames, problems);
      expect(problems).toEqual([]);
    } finally {
      lane.close();
    }
  });
});
