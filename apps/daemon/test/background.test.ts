import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ModelReply, type ModelRequest, type ModelServer, startModelServer } from "@crw/tools/models";
import { useTestDatabase } from "@crw/tools/pg";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/index.js";
import type { TestClient } from "./support/client.js";
import { startTestDaemon } from "./support/daemon.js";
import { gate } from "./support/provider.js";
import { waitFor } from "./support/wait.js";

/**
 * Ctrl+B from a client: a session's turn waits on a foreground Delegate or WorkflowStart whose work is held
 * at the model server; `session.background` lets the turn go on, and the held work's result reaches the
 * session later through its inbox, once. A real daemon with forked runners, a real PostgreSQL, a model
 * server on 127.0.0.1 speaking Chat Completions.
 */
const db = useTestDatabase();
const MODEL = "openai-completions:loopback-bg";
let models: ModelServer;
let daemon: Daemon;
let owner: TestClient;
let pool: pg.Pool;
const made: string[] = [];

/** Work held at the model server until the test lets it answer. */
const held = new Map<string, ReturnType<typeof gate> & { arrived: boolean }>();
const hold = (marker: string) => held.set(marker, { ...gate(), arrived: false });

/** What the workflow's snapshot said when the parent's turn went on after its WorkflowStart. */
const snapshotWhenParentWentOn: unknown[] = [];

async function answer(request: ModelRequest): Promise<ModelReply> {
  const task = request.userTexts.join("\n");
  for (const [marker, h] of held) {
    if (!task.includes(marker)) continue;
    h.arrived = true;
    await h.wait;
    return { text: `${marker} done` };
  }
  if (task.includes("DELEGATE-SLOW")) {
    if (request.toolResults.length === 0)
      return { tool: { name: "Delegate", arguments: { task: "SLOW-CHILD, answer when you can" } } };
    return { text: `parent goes on after: ${request.toolResults[0]?.text}` };
  }
  const start = /START-DEF (\S+)/.exec(task);
  if (start) {
    if (request.toolResults.length === 0)
      return { tool: { name: "WorkflowStart", arguments: { path: start[1], foreground: true } } };
    const workflowId = /\b([0-9a-f-]{36})\b/.exec(request.toolResults[0]?.text ?? "")?.[1];
    if (workflowId && snapshotWhenParentWentOn.length === 0) {
      const { rows } = await pool.query("select snapshot from workflows where id = $1::uuid", [workflowId]);
      snapshotWhenParentWentOn.push(rows[0]?.snapshot);
    }
    return { text: `parent goes on after: ${request.toolResults[0]?.text}` };
  }
  return { text: "nothing to do" };
}

beforeAll(async () => {
  models = await startModelServer(answer);
  const dataDir = mkdtempSync(join(tmpdir(), "crw-daemon-background-"));
  made.push(dataDir);
  pool = new pg.Pool({ connectionString: db.url, max: 2 });
  ({ daemon, owner } = await startTestDaemon({
    databaseUrl: db.url,
    dataDir,
    baseUrls: { "openai-completions": models.openaiBaseUrl },
    keyVar: "CRW_TEST_BACKGROUND_KEY",
    overrides: { runtime: { maxRunners: 1, turnsPerRunner: 4 }, models: { default: MODEL } },
  }));
});

afterAll(async () => {
  for (const h of held.values()) h.open();
  owner?.close();
  await daemon?.stop();
  await models?.close();
  await pool?.end();
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

/** The session's results and how many times each was acknowledged into its journal. */
async function resultsOf(sessionId: string) {
  const { rows } = await pool.query(
    `select r.kind, r.mode, r.body, (select count(*)::int from delegation_result_acks a where a.result_id = r.id) acks
       from delegation_results r where r.parent_session_id = $1::uuid order by r.queue_seq`,
    [sessionId],
  );
  return rows as { kind: string; mode: string; body: string; acks: number }[];
}

describe("Ctrl+B from a client: a session's foreground work goes on in the background", () => {
  it("a turn waiting on a foreground Delegate goes on once backgrounded, and the child's result arrives through the inbox once", async () => {
    hold("SLOW-CHILD");
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", { model: MODEL });
    const nothing = await owner.ok<{ delegations: unknown[]; workflows: unknown[] }>("session.background", {
      sessionId,
    });
    expect(nothing).toEqual({ delegations: [], workflows: [] });

    const sent = owner.ok<{ reply: string }>("session.send", { sessionId, text: "DELEGATE-SLOW please" });
    await waitFor(() => held.get("SLOW-CHILD")?.arrived === true, "the child's turn at the model");
    const moved = await owner.ok<{ delegations: { runId: string; moved: boolean }[]; workflows: unknown[] }>(
      "session.background",
      { sessionId },
    );
    expect(moved.workflows).toEqual([]);
    expect(moved.delegations).toEqual([{ runId: expect.any(String), moved: true }]);
    // the turn went on while the child still works: its answer is not in it
    const { reply } = await sent;
    expect(reply).toContain("parent goes on after:");
    expect(reply).not.toContain("SLOW-CHILD done");

    held.get("SLOW-CHILD")?.open();
    await waitFor(
      async () => (await resultsOf(sessionId)).some((r) => r.acks > 0),
      "the child's result acknowledged in the parent",
    );
    const results = await resultsOf(sessionId);
    expect(results).toEqual([{ kind: "subagent", mode: "background", body: expect.any(String), acks: 1 }]);
    expect(results[0]?.body).toContain("SLOW-CHILD done");
  });

  it("a turn waiting on a foreground WorkflowStart goes on once backgrounded, its snapshot already saying so, and the summary arrives through the inbox once (S004-279)", async () => {
    hold("SLOW-NODE");
    const repo = mkdtempSync(join(tmpdir(), "crw-background-repo-"));
    made.push(repo);
    execFileSync("git", ["init", "-q", "-b", "main"], { cwd: repo });
    mkdirSync(join(repo, ".crw"));
    const definition = { name: "held", nodes: [{ id: "slow", task: "SLOW-NODE, answer when you can" }] };
    writeFileSync(join(repo, ".crw", "held.json"), JSON.stringify(definition));
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODEL,
      cwd: repo,
    });

    const sent = owner.ok<{ reply: string }>("session.send", { sessionId, text: "START-DEF .crw/held.json" });
    await waitFor(() => held.get("SLOW-NODE")?.arrived === true, "the node's turn at the model");
    // While its snapshot cannot be written (the test holds the workflow's row), the waiter is not let go.
    const locker = await pool.connect();
    let asked: Promise<{ delegations: unknown[]; workflows: { workflowId: string; moved: boolean }[] }>;
    try {
      await locker.query("begin");
      await locker.query("select 1 from workflows where parent_session_id = $1::uuid for update", [
        sessionId,
      ]);
      asked = owner.ok("session.background", { sessionId });
      const parentWentOn = () =>
        models.requests.some(
          (q) => q.userTexts.some((t) => t.includes("START-DEF")) && q.toolResults.length > 0,
        );
      await new Promise((r) => setTimeout(r, 500));
      expect(parentWentOn()).toBe(false);
    } finally {
      await locker.query("rollback");
      locker.release();
    }
    const moved = await asked;
    // the node is the workflow's child, not a Delegate call of this session
    expect(moved.delegations).toEqual([]);
    expect(moved.workflows).toEqual([{ workflowId: expect.any(String), moved: true }]);
    const { reply } = await sent;
    expect(reply).toContain("moved to the background");
    expect(reply).not.toContain("SLOW-NODE done");
    // by the time the waiter was let go and the parent's turn went on, the background snapshot was stored
    expect(snapshotWhenParentWentOn).toEqual([
      expect.objectContaining({ background: true, status: "running", name: "held" }),
    ]);

    held.get("SLOW-NODE")?.open();
    await waitFor(
      async () => (await resultsOf(sessionId)).some((r) => r.acks > 0),
      "the workflow's summary acknowledged in the parent",
    );
    const results = await resultsOf(sessionId);
    expect(results).toEqual([
      { kind: "workflow_summary", mode: "background", body: expect.any(String), acks: 1 },
    ]);
    expect(results[0]?.body).toContain("SLOW-NODE done");
  });
});
