import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Daemon, loadConfig, ownerTokenPath, startDaemon } from "../src/index.js";
import { steps, TestClient } from "./support/client.js";
import { ownerHealth } from "./support/health.js";

const silent = pino({ level: "silent" });
const db = useTestDatabase();
let daemon: Daemon;
let owner: TestClient;
let other: TestClient;

beforeAll(async () => {
  const dataDir = scratchDir("crw-daemon-api-");
  daemon = await startDaemon(
    loadConfig({
      env: { DATABASE_URL: db.url },
      overrides: { dataDir, port: 0, runtime: { maxRunners: 1, turnsPerRunner: 8 } },
    }),
    { log: silent },
  );
  owner = await TestClient.connect(daemon.state.url, readFileSync(ownerTokenPath(dataDir), "utf8").trim());
  // A second account with its own token.
  const account = await daemon.runtime.repo.createAccount({ name: "someone-else" });
  const token = `crw_${randomBytes(18).toString("base64url")}`;
  await daemon.runtime.repo.addApiToken(account.id, createHash("sha256").update(token).digest(), "test");
  other = await TestClient.connect(daemon.state.url, token);
});
afterAll(async () => {
  owner?.close();
  other?.close();
  await daemon?.stop();
});

const messageCount = async (sessionId: string) => {
  const { rows } = await db.pool.query(
    "select count(*)::int as n from journal_entries where session_id = $1",
    [sessionId],
  );
  return rows[0].n as number;
};

describe("the daemon's JSON-RPC API", () => {
  it("a session's message is a turn of its agent loop; its Delegate child runs in a runner and its result is delivered once", async () => {
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
    const child = steps({ text: "the child's answer" });
    const reply = await owner.ok<{ stopReason: string; reply: string }>("session.send", {
      sessionId,
      text: steps(
        { toolCalls: [{ name: "Delegate", arguments: { task: child, background: false } }] },
        { text: "parent saw it" },
      ),
    });
    expect(reply).toMatchObject({ stopReason: "stop", reply: "parent saw it" });
    const read = await owner.ok<{ messages: { role: string; toolName?: string; text: string }[] }>(
      "session.read",
      { sessionId },
    );
    const results = read.messages.filter((m) => m.role === "toolResult" && m.toolName === "Delegate");
    expect(results).toEqual([expect.objectContaining({ text: "the child's answer" })]);
    expect(await daemon.runtime.repo.settledResultIds(sessionId, (await whoami()).accountId)).toHaveLength(1);
    // The default forked path: the child's turn ran in a runner, the root session's in the daemon.
    expect(daemon.runtime.placements.runner).toBeGreaterThanOrEqual(1);
    expect(owner.notifications.some((n) => n.method === "session.progress")).toBe(true);
  });

  it("requests for another account's session are refused with a clear error and change nothing", async () => {
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
    await owner.ok("session.send", { sessionId, text: "hello" });
    const before = await messageCount(sessionId);
    for (const [method, params] of [
      ["session.send", { sessionId, text: "let me in" }],
      ["session.delegate", { sessionId, task: "do something" }],
      ["session.read", { sessionId }],
      ["session.tap", { sessionId }],
      ["workflow.start", { sessionId, definition: "name: x\nnodes:\n  - {id: a, task: t}\n" }],
    ] as const) {
      const frame = await other.call(method, params);
      expect(frame.error, method).toMatchObject({
        data: { code: expect.stringMatching(/not_found|cross_account/) },
      });
    }
    expect(await messageCount(sessionId)).toBe(before);
    const { rows } = await db.pool.query(
      "select count(*)::int as n from workflows where parent_session_id = $1",
      [sessionId],
    );
    expect(rows[0].n).toBe(0);
  });

  it("a connection without a valid token is refused before any method runs", async () => {
    await expect(TestClient.connect(daemon.state.url)).rejects.toThrow(/401/);
    await expect(TestClient.connect(daemon.state.url, "crw_not-a-token")).rejects.toThrow(/401/);
  });

  it("bad params are refused as invalid_params", async () => {
    const frame = await owner.call("session.send", { sessionId: "nope", text: "" });
    expect(frame.error).toMatchObject({ code: -32602, data: { code: "invalid_params" } });
  });

  it("a workflow runs parallel branches and a dynamic expansion through the runner pool; progress per node, then one summary (S004-341 S004-066)", async () => {
    const expand = steps(
      {
        toolCalls: [
          {
            name: "WorkflowAddNodes",
            arguments: { nodes: [{ id: "extra", task: "the added node's work", dependsOn: ["plan"] }] },
          },
        ],
      },
      { text: "planned; added extra" },
    );
    const definition = JSON.stringify({
      name: "demo",
      nodes: [
        { id: "plan", task: expand },
        { id: "left", task: "left branch", dependsOn: ["plan"] },
        { id: "right", task: "right branch", dependsOn: ["plan"] },
        { id: "join", task: "join the branches", dependsOn: ["left", "right"] },
      ],
    });
    const runnerTurnsBefore = daemon.runtime.placements.runner;
    const started = await owner.ok<{ workflowId: string; sessionId: string; nodes: string[] }>(
      "workflow.start",
      {
        definition,
        format: "json",
      },
    );
    expect(started.nodes).toEqual(["plan", "left", "right", "join"]);
    const done = await owner.ok<{ status: string; summary: string; nodes: { id: string; status: string }[] }>(
      "workflow.follow",
      { workflowId: started.workflowId },
    );
    expect(done.status).toBe("completed");
    expect(done.nodes.map((n) => [n.id, n.status])).toEqual([
      ["plan", "succeeded"],
      ["left", "succeeded"],
      ["right", "succeeded"],
      ["join", "succeeded"],
      ["extra", "succeeded"],
    ]);
    expect(done.summary).toContain("- extra: succeeded");
    const progress = owner.notifications
      .filter((n) => n.method === "workflow.progress" && n.params.workflowId === started.workflowId)
      .map((n) => `${n.params.nodeId}:${n.params.status}`);
    for (const id of ["plan", "left", "right", "join", "extra"])
      expect(progress).toContain(`${id}:succeeded`);
    expect(daemon.runtime.placements.runner - runnerTurnsBefore).toBeGreaterThanOrEqual(5);
    // One summary reaches the parent session, never the node results.
    const account = (await whoami()).accountId;
    const { rows } = await db.pool.query(
      "select kind from delegation_results where parent_session_id = $1::uuid",
      [started.sessionId],
    );
    expect(rows.map((r) => r.kind)).toEqual(["workflow_summary"]);
    expect(await daemon.runtime.repo.settledResultIds(started.sessionId, account)).toHaveLength(1);
  });

  it("definitions with a cycle, unknown dependency, duplicate ids or a huge size are refused with nothing created", async () => {
    const count = async () =>
      (await db.pool.query("select count(*)::int as n from workflows")).rows[0].n as number;
    const before = await count();
    const cases: [string, RegExp][] = [
      [
        "name: c\nnodes:\n  - {id: a, task: t, dependsOn: [b]}\n  - {id: b, task: t, dependsOn: [a]}\n",
        /cycle/,
      ],
      ["name: u\nnodes:\n  - {id: a, task: t, dependsOn: [ghost]}\n", /unknown/],
      ["name: d\nnodes:\n  - {id: a, task: t}\n  - {id: a, task: t}\n", /duplicate/],
      [`name: h\nnodes:\n  - {id: a, task: "${"x".repeat(300 * 1024)}"}\n`, /too_large|limit/],
    ];
    for (const [definition, code] of cases) {
      const frame = await owner.call("workflow.start", { definition });
      const error = frame.error as { data: { code: string; name: string }; message: string };
      expect(`${error.data.code} ${error.message}`).toMatch(code);
      expect(error.data.name).toBe("WorkflowDefinitionError");
    }
    expect(await count()).toBe(before);
  });

  it("/health shows pool, runner, queue and recovery state", async () => {
    const health = (await ownerHealth(daemon.state.url, daemon.config.dataDir)) as Record<string, unknown>;
    expect(health).toMatchObject({
      status: "ok",
      pool: { mode: "runner", queued: expect.any(Number), runners: expect.any(Array), startupRetry: null },
      recovery: {
        finishedAt: expect.any(String),
        delegations: expect.any(Object),
        workflows: expect.any(Object),
      },
      alerts: [],
    });
  });
});

async function whoami(): Promise<{ accountId: string }> {
  return owner.ok("daemon.whoami");
}
