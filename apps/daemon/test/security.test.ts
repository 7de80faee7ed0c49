import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PgDelegationRepository } from "@crw/db";
import { type ModelReply, type ModelRequest, type ModelServer, startModelServer } from "@crw/tools/models";
import { useTestDatabase } from "@crw/tools/pg";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/index.js";
import { TestClient } from "./support/client.js";
import { startTestDaemon } from "./support/daemon.js";

/**
 * An account's grants (`tool_allow`, `tool_deny` of its accounts row) bound everything done for it, not
 * only the children its sessions' models delegate: its root sessions' turns, `session.delegate` and
 * `workflow.start` over the API. A real daemon, a real PostgreSQL, forked runners and a model server on
 * loopback whose requests show the tools each turn offers.
 */
const db = useTestDatabase();
const KEY = "CRW_TEST_GRANTS_KEY";
const MODEL = "openai-completions:loopback-grants";
let models: ModelServer;
let daemon: Daemon;
let owner: TestClient;
let guest: TestClient;
let repoDir: string;
const made: string[] = [];

/** Routes a request by the marker of its task. */
function answer(request: ModelRequest): ModelReply {
  const task = request.userTexts.join("\n");
  if (task.includes("DELEGATE-TO-SLASH")) {
    if (request.toolResults.length === 0)
      return { tool: { name: "Delegate", arguments: { task: "READ-HOSTNAME", cwd: "/" } } };
    return { text: `delegate said: ${request.toolResults[0]?.text}` };
  }
  if (task.includes("READ-HOSTNAME")) {
    if (request.toolResults.length === 0)
      return { tool: { name: "read", arguments: { path: "/etc/hostname" } } };
    return { text: `hostname: ${request.toolResults[0]?.text}` };
  }
  return { text: "looked" };
}

/** The newest request of the turn that worked on `marker`. */
function requestFor(marker: string): ModelRequest {
  const found = models.requests.findLast((q) => q.userTexts.some((t) => t.includes(marker)));
  if (!found) throw new Error(`no model request worked on ${marker}`);
  return found;
}

beforeAll(async () => {
  models = await startModelServer(answer);
  const dataDir = mkdtempSync(join(tmpdir(), "crw-daemon-grants-"));
  made.push(dataDir);
  repoDir = mkdtempSync(join(tmpdir(), "crw-grants-repo-"));
  made.push(repoDir);
  execFileSync("git", ["init", "-q", "-b", "main"], { cwd: repoDir });
  writeFileSync(join(repoDir, "README.md"), "grants\n");
  ({ daemon, owner } = await startTestDaemon({
    databaseUrl: db.url,
    dataDir,
    baseUrls: { "openai-completions": models.openaiBaseUrl },
    keyVar: KEY,
    overrides: { runtime: { maxRunners: 1, turnsPerRunner: 4 } },
  }));
  // A second account, neither owner nor administrator, whose grant denies the shell.
  const pool = new pg.Pool({ connectionString: db.url, max: 1 });
  let accountId: string;
  try {
    const repo = new PgDelegationRepository(pool);
    const account = await repo.createAccount({
      name: `no-shell-${randomBytes(4).toString("hex")}`,
      toolDeny: ["shell"],
    });
    accountId = account.id;
    const token = randomBytes(24).toString("base64url");
    await repo.addApiToken(account.id, createHash("sha256").update(token).digest());
    guest = await TestClient.connect(daemon.state.url, token);
  } finally {
    await pool.end();
  }
  await owner.ok("project.add", { path: repoDir, name: "grants", account: accountId });
});

afterAll(async () => {
  guest?.close();
  owner?.close();
  await daemon?.stop();
  await models?.close();
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

describe("an account's grants bound its root sessions and the API's work for it", () => {
  it("a root turn of an account whose grant denies shell offers no shell tool", async () => {
    const { sessionId } = await guest.ok<{ sessionId: string }>("session.create", {
      model: MODEL,
      cwd: repoDir,
    });
    await guest.ok("session.send", { sessionId, text: "GRANT-PROBE-ROOT" });
    const tools = requestFor("GRANT-PROBE-ROOT").tools;
    expect(tools).toContain("read");
    expect(tools).not.toContain("shell");
  });

  it("a root session without a working directory of that account still answers", async () => {
    const { sessionId } = await guest.ok<{ sessionId: string }>("session.create", { model: MODEL });
    const r = await guest.ok<{ stopReason: string; reply: string }>("session.send", {
      sessionId,
      text: "GRANT-PROBE-BARE",
    });
    expect(r).toMatchObject({ stopReason: "stop", reply: "looked" });
    expect(requestFor("GRANT-PROBE-BARE").tools).not.toContain("shell");
  });

  it("a session.delegate child of that account offers no shell tool", async () => {
    const { sessionId } = await guest.ok<{ sessionId: string }>("session.create", {
      model: MODEL,
      cwd: repoDir,
    });
    const receipt = await guest.ok<{ body: string }>("session.delegate", {
      sessionId,
      task: "GRANT-PROBE-CHILD",
    });
    expect(receipt.body).toContain("looked");
    const tools = requestFor("GRANT-PROBE-CHILD").tools;
    expect(tools).toContain("read");
    expect(tools).not.toContain("shell");
  });

  it("a workflow node started for that account over the API offers no shell tool", async () => {
    const definition = JSON.stringify({
      name: "grants",
      nodes: [{ id: "probe", task: "GRANT-PROBE-NODE", model: MODEL }],
    });
    const started = await guest.ok<{ workflowId: string }>("workflow.start", {
      definition,
      format: "json",
      cwd: repoDir,
      model: MODEL,
    });
    const done = await guest.ok<{ status: string }>("workflow.follow", { workflowId: started.workflowId });
    expect(done.status).toBe("completed");
    const tools = requestFor("GRANT-PROBE-NODE").tools;
    expect(tools).toContain("read");
    expect(tools).not.toContain("shell");
  });
});

describe("a child's working directory bounds its own children", () => {
  it('a child in proj delegating with cwd "/" is refused, and no grandchild reads /etc/hostname', async () => {
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODEL,
      cwd: repoDir,
    });
    // The child (in proj, the parent's own directory) asks its model, which delegates to "/".
    const receipt = await owner.ok<{ body: string; childSessionId: string }>("session.delegate", {
      sessionId,
      task: "DELEGATE-TO-SLASH",
    });
    expect(receipt.body).toMatch(/delegate said: .*outside the (parent's|selected) project/s);
    // The same request over the API, with the child as the parent, is refused the same way.
    const direct = await owner.call("session.delegate", {
      sessionId: receipt.childSessionId,
      task: "READ-HOSTNAME",
      cwd: "/",
    });
    expect(direct.error).toMatchObject({ data: { code: "work_dir_outside_project" } });
    expect(models.requests.some((q) => q.userTexts.some((t) => t.includes("READ-HOSTNAME")))).toBe(false);
  });
});
