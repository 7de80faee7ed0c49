import { mkdtempSync, rmSync } from "node:fs";
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
 * A workflow node whose turn finds every runner full: one runner with room for one turn, taken by a
 * delegated child held at the model server. A real daemon and PostgreSQL, a model server on 127.0.0.1.
 */
const db = useTestDatabase();
const MODEL = "openai-completions:loopback-queue";
let models: ModelServer;
let daemon: Daemon;
let owner: TestClient;
let pool: pg.Pool;
let dataDir: string;
const held = gate();
let holderArrived = false;

async function answer(request: ModelRequest): Promise<ModelReply> {
  const task = request.userTexts.join("\n");
  if (task.includes("HOLD-THE-RUNNER")) {
    holderArrived = true;
    await held.wait;
    return { text: "let the runner go" };
  }
  if (task.includes("QUEUED-NODE")) return { text: "the node ran" };
  return { text: "nothing to do" };
}

beforeAll(async () => {
  models = await startModelServer(answer);
  dataDir = mkdtempSync(join(tmpdir(), "crw-daemon-queued-node-"));
  pool = new pg.Pool({ connectionString: db.url, max: 1 });
  ({ daemon, owner } = await startTestDaemon({
    databaseUrl: db.url,
    dataDir,
    baseUrls: { "openai-completions": models.openaiBaseUrl },
    keyVar: "CRW_TEST_QUEUED_NODE_KEY",
    overrides: { runtime: { maxRunners: 1, turnsPerRunner: 1 }, models: { default: MODEL } },
  }));
});

afterAll(async () => {
  held.open();
  owner?.close();
  await daemon?.stop();
  await models?.close();
  await pool?.end();
  rmSync(dataDir, { recursive: true, force: true });
});

describe("a workflow node in a full pool", () => {
  it("waits for a runner with its child session and its journaled running state (the node's run) already stored, reported queued until it runs (S004-185)", async () => {
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", { model: MODEL });
    await owner.ok("session.delegate", { sessionId, task: "HOLD-THE-RUNNER", background: true });
    await waitFor(() => holderArrived, "the runner's one turn taken");

    const definition = JSON.stringify({ name: "queued", nodes: [{ id: "n", task: "QUEUED-NODE please" }] });
    const { workflowId } = await owner.ok<{ workflowId: string }>("workflow.start", {
      definition,
      format: "json",
      sessionId,
    });
    // the node's child is made and journaled; its turn waits for the runner
    const journaled = async () =>
      (
        await pool.query(
          "select body->'state' as state from workflow_journal_nodes where workflow_id = $1::uuid and node_id = 'n'",
          [workflowId],
        )
      ).rows[0]?.state as { status: string; childSessionId?: string } | undefined;
    let child = "";
    await waitFor(async () => {
      child = (await journaled())?.childSessionId ?? "";
      const where = child ? daemon.runtime.executionFor(child) : null;
      return where?.location === "runner" && where.state === "queued";
    }, "the node's child queued");
    // a node's run is its journaled state (running, with its child), stored with the child's session row
    const stored = await pool.query("select kind, parent_session_id from sessions where id = $1::uuid", [
      child,
    ]);
    expect(stored.rows).toEqual([{ kind: "delegated", parent_session_id: sessionId }]);
    expect(await journaled()).toMatchObject({ status: "running", childSessionId: child });
    expect(models.requests.some((q) => q.userTexts.some((t) => t.includes("QUEUED-NODE")))).toBe(false);
    expect(daemon.runtime.executionFor(child)).toMatchObject({ location: "runner", state: "queued" });

    held.open();
    const done = await owner.ok<{ status: string; summary: string }>("workflow.follow", { workflowId });
    expect(done.status).toBe("completed");
    expect(done.summary).toContain("the node ran");
  });
});
