import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import pg from "pg";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { scopeHealthDocument } from "../src/api/health.js";
import { type Daemon, loadConfig, ownerTokenPath, startDaemon } from "../src/index.js";
import { RpcRegistry } from "../src/rpc.js";
import { TestClient } from "./support/client.js";

/** The findings of the "Security" issue, each with the exact case that showed it. */
const silent = pino({ level: "silent" });
const db = useTestDatabase();
let daemon: Daemon;
let ownerToken: string;
let owner: TestClient;
let other: TestClient;
let otherToken: string;
let otherAccountId: string;

beforeAll(async () => {
  const dataDir = scratchDir("crw-daemon-sec-");
  daemon = await startDaemon(
    loadConfig({
      env: { DATABASE_URL: db.url },
      overrides: { dataDir, port: 0, runtime: { maxRunners: 1, turnsPerRunner: 8 } },
    }),
    { log: silent },
  );
  ownerToken = readFileSync(ownerTokenPath(dataDir), "utf8").trim();
  owner = await TestClient.connect(daemon.state.url, ownerToken);
  const account = await daemon.runtime.repo.createAccount({ name: "someone-else" });
  otherAccountId = account.id;
  otherToken = `crw_${randomBytes(18).toString("base64url")}`;
  await daemon.runtime.repo.addApiToken(account.id, createHash("sha256").update(otherToken).digest(), "test");
  other = await TestClient.connect(daemon.state.url, otherToken);
});
afterAll(async () => {
  owner?.close();
  other?.close();
  await daemon?.stop();
});

const sessionCount = async (accountId?: string) =>
  (
    await db.pool.query(
      "select count(*)::int as n from sessions where $1::uuid is null or principal_account_id = $1::uuid",
      [accountId ?? null],
    )
  ).rows[0].n as number;

/** A raw connection: frames as sent, every frame received, and how it closed. */
async function rawConnect(token: string) {
  const ws = new WebSocket(`${daemon.state.url.replace("http", "ws")}/rpc`, {
    headers: { authorization: `Bearer ${token}` },
  });
  const frames: Record<string, unknown>[] = [];
  ws.on("message", (data) => frames.push(JSON.parse(data.toString())));
  const closed = new Promise<{ code: number; reason: string }>((r) =>
    ws.on("close", (code, reason) => r({ code, reason: reason.toString() })),
  );
  await new Promise((resolve, reject) => {
    ws.once("open", resolve);
    ws.once("error", reject);
  });
  return { ws, frames, closed };
}

const waitFor = async (check: () => boolean, ms: number) => {
  const deadline = Date.now() + ms;
  while (!check() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  return check();
};

const health = async (token?: string) => {
  const res = await fetch(`${daemon.state.url}/health`, {
    signal: AbortSignal.timeout(5_000),
    ...(token ? { headers: { authorization: `Bearer ${token}` } } : {}),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
};

const UUID_G = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/gi;

describe("security findings of the daemon's API", () => {
  it("#7: a client that never reads: past 32 requests in flight it is refused too_many_requests, past 16 MiB unread output it is closed (1008), memory stays bounded and /health answers", async () => {
    // A transcript whose read is ~4 MB: 1000 messages, each clipped to 4000 chars in the view.
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
    const accountId = (await owner.ok<{ accountId: string }>("daemon.whoami")).accountId;
    const big = "m".repeat(5000);
    for (let i = 0; i < 10; i++)
      await daemon.runtime.repo.append(
        sessionId,
        accountId,
        Array.from({ length: 100 }, () => ({
          body: { type: "message" as const, message: { role: "user" as const, content: big } },
        })),
      );

    const conn = await rawConnect(ownerToken);
    const socket = (conn.ws as unknown as { _socket: { pause(): void; resume(): void } })._socket;
    socket.pause();
    const rssStart = process.memoryUsage().rss;
    let rssMax = rssStart;
    for (let id = 1; id <= 300; id++)
      conn.ws.send(
        JSON.stringify({ jsonrpc: "2.0", id, method: "session.read", params: { sessionId, limit: 1000 } }),
      );
    // Meanwhile the daemon serves everyone else; its memory does not follow the unread replies.
    for (let i = 0; i < 16; i++) {
      expect((await health()).status).toBe(200);
      rssMax = Math.max(rssMax, process.memoryUsage().rss);
      // Unbounded, these 300 replies of ~4 MB each stay in memory (> 1.2 GB); bounded, what remains is the
      // 32 reads in flight (each reads the whole journal) and 16 MiB of unread output.
      expect(rssMax - rssStart).toBeLessThan(768 * 1024 * 1024);
      await new Promise((r) => setTimeout(r, 250));
    }
    socket.resume();
    const closed = await Promise.race([
      conn.closed,
      new Promise<null>((r) => setTimeout(() => r(null), 20_000)),
    ]);
    expect(closed).toMatchObject({ code: 1008, reason: expect.stringMatching(/unread|buffer/) });
    const results = conn.frames.filter((f) => f.result);
    const refused = conn.frames.filter(
      (f) => (f.error as { data?: { code?: string } } | undefined)?.data?.code === "too_many_requests",
    );
    expect(results.length).toBeLessThan(32);
    expect(refused.length).toBeGreaterThan(200);
    console.info(
      `#7: rss growth ${Math.round((rssMax - rssStart) / 2 ** 20)} MB, ${results.length} replies, ${refused.length} refused`,
    );
    // The closed connection was the only one affected.
    expect(await owner.ok("daemon.whoami")).toMatchObject({ accountId });
  }, 90_000);

  it("#10: a request whose id is an object, array, boolean or null is answered invalid_request (id null) and not run", async () => {
    const conn = await rawConnect(otherToken);
    const before = await sessionCount(otherAccountId);
    const ids = [{ a: 1 }, [1], true, false, null];
    for (const id of ids) conn.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method: "session.create" }));
    // a number no reply could carry back: 1e400 parses to Infinity
    ids.push("1e400" as never);
    conn.ws.send('{"jsonrpc":"2.0","id":1e400,"method":"session.create"}');
    expect(await waitFor(() => conn.frames.length >= ids.length, 5_000)).toBe(true);
    await new Promise((r) => setTimeout(r, 300));
    expect(conn.frames).toHaveLength(ids.length);
    for (const f of conn.frames)
      expect(f).toMatchObject({ id: null, error: { code: -32600, data: { code: "invalid_request" } } });
    expect(await sessionCount(otherAccountId)).toBe(before);
    conn.ws.close();
  });

  it("#11: U+0000 in a param that reaches SQL (session.send text, session.create model, a workflow's task) is refused invalid_params, never a raw PostgreSQL error", async () => {
    const { sessionId } = await other.ok<{ sessionId: string }>("session.create");
    // A raw U+0000 in any param is refused where params are read.
    const raw: [string, object][] = [
      ["session.send", { sessionId, text: "hello\u0000world" }],
      ["session.create", { model: "scripted\u0000" }],
      ["session.create", { cwd: "/tmp\u0000" }],
      ["workflow.start", { sessionId, definition: 'name: n\nnodes:\n  - {id: a, task: "x\u0000y"}\n' }],
    ];
    // An escape that only the definition's parser turns into U+0000 is refused by the definition's schema.
    const escaped: [string, object][] = [
      ["workflow.start", { sessionId, definition: `name: n\nnodes:\n  - {id: a, task: "x\\0y"}\n` }],
      [
        "workflow.start",
        { sessionId, format: "json", definition: '{"name":"n","nodes":[{"id":"a","task":"x\\u0000"}]}' },
      ],
    ];
    const before = await sessionCount(otherAccountId);
    for (const [method, params] of [...raw, ...escaped]) {
      const frame = await other.call(method, params);
      const error = frame.error as { code: number; data: { name: string; code: string } };
      if (raw.some(([, p]) => p === params))
        expect(error, method).toMatchObject({ code: -32602, data: { code: "invalid_params" } });
      else
        expect(error.data, method).toMatchObject({
          name: "WorkflowDefinitionError",
          code: "definition_invalid",
        });
      expect(JSON.stringify(error), method).not.toMatch(/SQLSTATE|2202|22P05|byte sequence|"name":"error"/);
    }
    expect(await sessionCount(otherAccountId)).toBe(before);
  });

  it("a model name longer than a session row holds (201 characters) is refused invalid_params at the API, nothing made", async () => {
    const before = await sessionCount(otherAccountId);
    const frame = await other.call("session.create", { model: "m".repeat(201) });
    expect(frame.error).toMatchObject({ data: { code: "invalid_params" } });
    expect(await other.ok("session.create", { model: "m".repeat(200) })).toMatchObject({
      sessionId: expect.any(String),
    });
    expect(await sessionCount(otherAccountId)).toBe(before + 1);
  });

  it("#11: a PostgreSQL error that still escapes a handler is one typed internal error, without the driver's message or SQLSTATE; logged in full", async () => {
    const rpc = new RpcRegistry();
    const err = Object.assign(
      new pg.DatabaseError('invalid byte sequence for encoding "UTF8": 0x00', 0, "error"),
      {
        code: "22021",
        severity: "ERROR",
        routine: "report_invalid_encoding",
      },
    );
    rpc.register("boom", {
      params: (await import("zod")).z.object({}),
      handler: async () => {
        throw err;
      },
    });
    const logged: unknown[] = [];
    const log = pino({ level: "error" }, { write: (line: string) => logged.push(JSON.parse(line)) });
    const frame = await rpc.handle(
      { jsonrpc: "2.0", id: 7, method: "boom" },
      { accountId: "a", notify: () => {}, signal: new AbortController().signal, log },
    );
    expect(frame).toEqual({
      jsonrpc: "2.0",
      id: 7,
      error: { code: -32603, message: "internal error", data: { name: "InternalError", code: "internal" } },
    });
    expect(JSON.stringify(logged)).toMatch(/22021/);
  });

  it("#15: /health without a valid token is liveness only; with a token the full document, ids scoped to the account (the owner sees all)", async () => {
    for (const token of [undefined, "crw_not-a-token"]) {
      const anon = await health(token);
      expect(anon.status).toBe(200);
      expect(anon.body).toEqual({ ok: true, status: "ok" });
    }
    const full = await health(ownerToken);
    expect(full.body).toMatchObject({ status: "ok", pool: expect.any(Object), recovery: expect.any(Object) });
    const theirs = await health(otherToken);
    expect(theirs.body).toMatchObject({ status: "ok", pool: expect.any(Object) });
    // The same document over RPC (daemon.health) is scoped the same way.
    const viaRpc = await other.ok("daemon.health");
    expect(viaRpc).toMatchObject({ status: "ok", pool: expect.any(Object) });
    for (const id of JSON.stringify([theirs.body, viaRpc]).match(UUID_G) ?? [])
      await expect(daemon.runtime.repo.getSession(id, otherAccountId)).resolves.toBeDefined();
  });

  it("#15: the health document keeps only the ids an account owns", async () => {
    const mine = "00000000-0000-4000-8000-000000000001";
    const foreign = "00000000-0000-4000-8000-000000000002";
    const scoped = await scopeHealthDocument(
      {
        status: "ok",
        executions: [
          { sessionId: mine, location: "daemon" },
          { sessionId: foreign, location: "runner" },
        ],
        recovery: {
          workflows: { resumed: [mine, foreign], invalid: [foreign] },
          delegations: { failed: [foreign] },
        },
        pool: { queued: 1 },
      },
      async (id) => id === mine,
    );
    expect(scoped).toEqual({
      status: "ok",
      executions: [{ sessionId: mine, location: "daemon" }],
      recovery: { workflows: { resumed: [mine], invalid: [] }, delegations: { failed: [] } },
      pool: { queued: 1 },
    });
  });

  it("#17: a failed workflow.start without sessionId leaves no root session behind", async () => {
    const before = await sessionCount();
    const bad = [
      {
        definition:
          "name: c\nnodes:\n  - {id: a, task: t, dependsOn: [b]}\n  - {id: b, task: t, dependsOn: [a]}\n",
      },
      { definition: `name: n\nnodes:\n  - {id: a, task: "x\\0y"}\n` },
      { format: "json", definition: '{"name":"n","nodes":[{"id":"a","task":"x\\u0000"}]}' },
    ];
    for (const params of bad) {
      const frame = await other.call("workflow.start", params);
      expect(frame.error, params.definition).toBeDefined();
    }
    expect(await sessionCount()).toBe(before);
  });
});
