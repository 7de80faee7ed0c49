import { readFileSync } from "node:fs";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { type Daemon, loadConfig, ownerTokenPath, startDaemon } from "../src/index.js";
import { TestClient } from "./support/client.js";

/**
 * Accounts and tokens of one installation: two daemons on one database share its owner account, a token
 * issued on one authenticates on the other, and a revocation on one closes the connections the other
 * opened with that token.
 */
const silent = pino({ level: "silent" });
const db = useTestDatabase();
const daemons: Daemon[] = [];
const clients: TestClient[] = [];
let a: Daemon;
let b: Daemon;
let ownerA: TestClient;
let ownerB: TestClient;
const tokens = { a: "", b: "" };

async function daemonOn(): Promise<{ daemon: Daemon; token: string }> {
  const dataDir = scratchDir("crw-daemon-accounts-");
  const daemon = await startDaemon(
    loadConfig({
      env: { DATABASE_URL: db.url },
      overrides: { dataDir, port: 0, runtime: { maxRunners: 1, turnsPerRunner: 8 } },
    }),
    { log: silent },
  );
  daemons.push(daemon);
  return { daemon, token: readFileSync(ownerTokenPath(dataDir), "utf8").trim() };
}

async function connect(d: Daemon, token: string): Promise<TestClient> {
  const c = await TestClient.connect(d.state.url, token);
  clients.push(c);
  return c;
}

/** How a connection closed: its code and reason, or null if it is still open after `ms`. */
function closedWithin(c: TestClient, ms: number): Promise<{ code: number; reason: string } | null> {
  if (c.ws.readyState === WebSocket.CLOSED) return Promise.resolve({ code: -1, reason: "already closed" });
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(null), ms);
    c.ws.once("close", (code, reason) => {
      clearTimeout(timer);
      resolve({ code, reason: reason.toString() });
    });
  });
}

const refusedUpgrade = (d: Daemon, token: string) =>
  TestClient.connect(d.state.url, token).then(
    (c) => {
      c.close();
      return "accepted";
    },
    (e: Error) => e.message,
  );

const errorCode = async (c: TestClient, method: string, params: object = {}) => {
  const frame = await c.call(method, params);
  return (frame.error as { data?: { code?: string } } | undefined)?.data?.code ?? "ok";
};

beforeAll(async () => {
  // two daemons booting together on a fresh database
  const [first, second] = await Promise.all([daemonOn(), daemonOn()]);
  a = first.daemon;
  b = second.daemon;
  tokens.a = first.token;
  tokens.b = second.token;
  ownerA = await connect(a, tokens.a);
  ownerB = await connect(b, tokens.b);
}, 120_000);

afterAll(async () => {
  for (const c of clients) c.close();
  for (const d of daemons) await d.stop();
});

describe("one installation per database", () => {
  it("daemons that boot together on one database make one owner account, and each owner.token works on both", async () => {
    const owners = await db.pool.query("select id from accounts where is_owner");
    expect(owners.rows).toHaveLength(1);
    const ownerId = owners.rows[0].id;
    for (const d of [a, b])
      for (const token of [tokens.a, tokens.b]) {
        const c = await connect(d, token);
        expect(await c.ok("daemon.whoami")).toMatchObject({ accountId: ownerId, isOwner: true });
      }
    expect(tokens.a).not.toBe(tokens.b);
  });

  it("a third daemon started later on the database reads the owner account instead of making one", async () => {
    const { daemon, token } = await daemonOn();
    const c = await connect(daemon, token);
    const who = await c.ok<{ accountId: string }>("daemon.whoami");
    expect(who.accountId).toBe((await ownerA.ok<{ accountId: string }>("daemon.whoami")).accountId);
    expect((await db.pool.query("select count(*)::int as n from accounts where is_owner")).rows[0].n).toBe(1);
    await daemon.stop();
  }, 60_000);
});

describe("accounts and tokens", () => {
  it("the owner makes an account on one daemon; a token issued for it on that daemon authenticates on the other, and only its hash is stored", async () => {
    const made = await ownerA.ok<{ id: string; name: string; administrator: boolean; allow: unknown }>(
      "account.create",
      { name: "alice" },
    );
    expect(made).toMatchObject({ name: "alice", owner: false, administrator: false, allow: null, deny: [] });
    const issued = await ownerA.ok<{ token: string; id: string }>("token.issue", {
      account: "alice",
      label: "laptop",
    });
    expect(issued.token).toMatch(/^crw_[A-Za-z0-9_-]{32}$/);
    expect(issued.id).toMatch(/^[0-9a-f]{12}$/);
    const onB = await connect(b, issued.token);
    expect(await onB.ok("daemon.whoami")).toMatchObject({
      accountId: made.id,
      name: "alice",
      isOwner: false,
    });
    // the database holds no token text, and the list shows ids, never tokens
    const stored = await db.pool.query("select * from account_api_tokens where account_id = $1", [made.id]);
    expect(JSON.stringify(stored.rows)).not.toContain(issued.token);
    const listed = await ownerB.ok<{ tokens: object[] }>("token.list", { account: "alice" });
    expect(listed.tokens).toEqual([
      expect.objectContaining({ id: issued.id, account: "alice", label: "laptop", revokedAt: null }),
    ]);
    expect(JSON.stringify(listed)).not.toContain(issued.token);
  });

  it("account.grant sets the tools an account's sessions may use; a bad tool entry is refused with nothing changed", async () => {
    await ownerA.ok("account.create", { name: "grantee" });
    const set = await ownerB.ok("account.grant", {
      account: "grantee",
      allow: ["Read", "Bash(git *)"],
      deny: ["Bash(git push*)"],
    });
    expect(set).toMatchObject({ allow: ["Read", "Bash(git *)"], deny: ["Bash(git push*)"] });
    const row = await db.pool.query("select tool_allow, tool_deny from accounts where name = 'grantee'");
    expect(row.rows[0]).toEqual({ tool_allow: ["Read", "Bash(git *)"], tool_deny: ["Bash(git push*)"] });
    expect(await errorCode(ownerA, "account.grant", { account: "grantee", allow: ["no spaces"] })).toBe(
      "invalid_params",
    );
    expect(await errorCode(ownerA, "account.grant", { account: "grantee" })).toBe("invalid_params");
    // allow null: every tool again; deny kept
    expect(await ownerA.ok("account.grant", { account: "grantee", allow: null })).toMatchObject({
      allow: null,
      deny: ["Bash(git push*)"],
    });
    expect(await errorCode(ownerA, "account.grant", { account: "owner", allow: [] })).toBe("not_permitted");
    expect(await errorCode(ownerA, "account.grant", { account: "nobody", allow: [] })).toBe("not_found");
  });

  it("names are checked: a taken name is a conflict, a malformed one invalid, and nothing is made", async () => {
    const before = (await db.pool.query("select count(*)::int as n from accounts")).rows[0].n;
    expect(await errorCode(ownerA, "account.create", { name: "alice" })).toBe("conflict");
    expect(await errorCode(ownerA, "account.create", { name: "" })).toBe("invalid_params");
    expect(await errorCode(ownerA, "account.create", { name: "has space" })).toBe("invalid_params");
    expect(await errorCode(ownerA, "account.create", { name: "x".repeat(201) })).toBe("invalid_params");
    expect((await db.pool.query("select count(*)::int as n from accounts")).rows[0].n).toBe(before);
  });

  it("an ordinary account may call none of the account and token methods", async () => {
    const issued = await ownerA.ok<{ token: string }>("token.issue", { account: "alice" });
    const alice = await connect(a, issued.token);
    for (const [method, params] of [
      ["account.create", { name: "mallory" }],
      ["account.list", {}],
      ["account.grant", { account: "alice", allow: null }],
      ["token.issue", { account: "alice" }],
      ["token.list", {}],
      ["token.revoke", { id: "000000000000" }],
    ] as const)
      expect(await errorCode(alice, method, params), method).toBe("not_permitted");
    expect((await db.pool.query("select 1 from accounts where name = 'mallory'")).rows).toHaveLength(0);
  });

  it("an administrator manages ordinary accounts, but never the owner's or another administrator's", async () => {
    await ownerA.ok("account.create", { name: "admin-1", administrator: true });
    await ownerA.ok("account.create", { name: "admin-2", administrator: true });
    const admin = await connect(
      b,
      (await ownerA.ok<{ token: string }>("token.issue", { account: "admin-1" })).token,
    );
    expect(await admin.ok("account.create", { name: "bob" })).toMatchObject({
      name: "bob",
      administrator: false,
    });
    const bob = await admin.ok<{ token: string; id: string }>("token.issue", { account: "bob" });
    expect(await errorCode(admin, "account.create", { name: "admin-3", administrator: true })).toBe(
      "not_permitted",
    );
    expect(await errorCode(admin, "token.issue", { account: "owner" })).toBe("not_permitted");
    expect(await errorCode(admin, "token.issue", { account: "admin-2" })).toBe("not_permitted");
    expect(await errorCode(admin, "account.grant", { account: "admin-2", allow: [] })).toBe("not_permitted");
    const ownerTokens = await ownerA.ok<{ tokens: { id: string; account: string }[] }>("token.list", {
      account: "owner",
    });
    expect(await errorCode(admin, "token.revoke", { id: ownerTokens.tokens[0]?.id ?? "" })).toBe(
      "not_permitted",
    );
    // an administrator's list leaves out the owner's and the other administrators' tokens
    const seen = await admin.ok<{ tokens: { account: string }[] }>("token.list");
    expect(new Set(seen.tokens.map((t) => t.account))).not.toContain("owner");
    expect(new Set(seen.tokens.map((t) => t.account))).not.toContain("admin-2");
    expect(await admin.ok("token.revoke", { id: bob.id })).toMatchObject({ account: "bob" });
  });
});

describe("isolation between accounts", () => {
  it("an account cannot read, send to, delegate from, tap, land, cancel or follow another account's sessions and workflows: the same error as for an id that does not exist", async () => {
    const { sessionId } = await ownerA.ok<{ sessionId: string }>("session.create");
    await ownerA.ok("session.send", { sessionId, text: "the owner's own words" });
    const { workflowId } = await ownerA.ok<{ workflowId: string }>("workflow.start", {
      sessionId,
      format: "json",
      definition: JSON.stringify({ name: "owned", nodes: [{ id: "a", task: "the owner's node" }] }),
    });
    await ownerA.ok("account.create", { name: "frank" });
    const frank = await connect(
      b,
      (await ownerA.ok<{ token: string }>("token.issue", { account: "frank" })).token,
    );
    const missingSession = "00000000-0000-4000-8000-000000000001";
    const missingWorkflow = "00000000-0000-4000-8000-000000000002";
    const asked: [string, (id: string) => object, string, string][] = [
      ["session.read", (id) => ({ sessionId: id }), sessionId, missingSession],
      ["session.send", (id) => ({ sessionId: id, text: "let me in" }), sessionId, missingSession],
      ["session.delegate", (id) => ({ sessionId: id, task: "work for me" }), sessionId, missingSession],
      ["session.status", (id) => ({ sessionId: id }), sessionId, missingSession],
      ["session.tap", (id) => ({ sessionId: id }), sessionId, missingSession],
      ["session.land", (id) => ({ sessionId: id }), sessionId, missingSession],
      ["workflow.status", (id) => ({ workflowId: id }), workflowId, missingWorkflow],
      ["workflow.cancel", (id) => ({ workflowId: id }), workflowId, missingWorkflow],
      ["workflow.follow", (id) => ({ workflowId: id }), workflowId, missingWorkflow],
      ["workflow.land", (id) => ({ workflowId: id }), workflowId, missingWorkflow],
    ];
    const before = await db.pool.query(
      "select (select count(*)::int from journal_entries where session_id = $1) as entries, (select status from workflows where id = $2) as status",
      [sessionId, workflowId],
    );
    for (const [method, params, owned, missing] of asked) {
      const theirs = await frank.call(method, params(owned));
      const none = await frank.call(method, params(missing));
      const shape = (frame: Record<string, unknown>, id: string) =>
        JSON.stringify(frame.error ?? { result: "answered" }).replaceAll(id, "<id>");
      expect(theirs.error, method).toBeDefined();
      expect(shape(theirs, owned), method).toBe(shape(none, missing));
    }
    // nothing of the owner's changed, and nothing was made in frank's name
    const after = await db.pool.query(
      "select (select count(*)::int from journal_entries where session_id = $1) as entries, (select status from workflows where id = $2) as status",
      [sessionId, workflowId],
    );
    expect(after.rows[0].entries).toBe(before.rows[0].entries);
    expect(after.rows[0].status).not.toBe("cancelled");
    const made = await db.pool.query(
      "select count(*)::int as n from sessions s join accounts a on a.id = s.principal_account_id where a.name = 'frank'",
    );
    expect(made.rows[0].n).toBe(0);
  }, 60_000);
});

describe("revocation", () => {
  it("a token revoked on one daemon is refused at once on both, and the connections opened with it on the other are closed", async () => {
    await ownerA.ok("account.create", { name: "carol" });
    const issued = await ownerA.ok<{ token: string; id: string }>("token.issue", { account: "carol" });
    const onA = await connect(a, issued.token);
    const onB = await connect(b, issued.token);
    const other = await connect(b, tokens.a);
    expect(await onB.ok("daemon.whoami")).toMatchObject({ name: "carol" });
    const closedB = closedWithin(onB, 5_000);
    const closedA = closedWithin(onA, 5_000);
    const t0 = Date.now();
    const revoked = await ownerA.ok<{ revokedAt: string | null }>("token.revoke", { id: issued.id });
    expect(revoked.revokedAt).not.toBeNull();
    expect(await closedB).toEqual({ code: 1008, reason: "token revoked" });
    expect(await closedA).toEqual({ code: 1008, reason: "token revoked" });
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(await refusedUpgrade(a, issued.token)).toBe("HTTP 401");
    expect(await refusedUpgrade(b, issued.token)).toBe("HTTP 401");
    // connections of other tokens stay
    expect(await other.ok("daemon.whoami")).toMatchObject({ isOwner: true });
    // revoked twice: the first time is kept
    expect(await ownerB.ok("token.revoke", { id: issued.id })).toMatchObject({
      revokedAt: revoked.revokedAt,
    });
  });

  it("a revocation committed while a daemon's listener was cut off closes that daemon's connections once it listens again", async () => {
    await ownerA.ok("account.create", { name: "dave" });
    const issued = await ownerA.ok<{ token: string; id: string }>("token.issue", { account: "dave" });
    const onB = await connect(b, issued.token);
    const closed = closedWithin(onB, 10_000);
    // revoked behind the daemons' backs (no notification), then every listening connection is cut: only
    // the re-check a listener makes when it is in place again can find it
    await db.pool.query(
      "update account_api_tokens set revoked_at = now() where substring(token_hash from 1 for 6) = decode($1, 'hex')",
      [issued.id],
    );
    const cut = await db.pool.query(
      "select pg_terminate_backend(pid) from pg_stat_activity where datname = current_database() and query ilike 'listen crw_token_revoked%'",
    );
    expect(cut.rows.length).toBeGreaterThanOrEqual(2);
    expect(await closed).toEqual({ code: 1008, reason: "token revoked" });
    // the daemon listens again: a later revocation still reaches it through the notification
    await ownerA.ok("account.create", { name: "erin" });
    const erin = await ownerA.ok<{ token: string; id: string }>("token.issue", { account: "erin" });
    const erinOnB = await connect(b, erin.token);
    const erinClosed = closedWithin(erinOnB, 10_000);
    await ownerA.ok("token.revoke", { id: erin.id });
    expect(await erinClosed).toEqual({ code: 1008, reason: "token revoked" });
  }, 30_000);

  it("a token id that names no token is not_found, a malformed one invalid_params", async () => {
    expect(await errorCode(ownerA, "token.revoke", { id: "ffffffffffff" })).toBe("not_found");
    expect(await errorCode(ownerA, "token.revoke", { id: "crw_secret" })).toBe("invalid_params");
  });
});
