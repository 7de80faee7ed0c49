import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ModelReply, type ModelRequest, type ModelServer, startModelServer } from "@crw/tools/models";
import { useTestDatabase } from "@crw/tools/pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TestClient } from "./support/client.js";
import { type DaemonProcess, spawnDaemon } from "./support/process.js";
import { waitFor } from "./support/wait.js";

/**
 * An effect cut off by a crash is never run again: the daemon (and with it the runner and the sandboxed
 * command) is SIGKILLed while a child's shell command runs; after the restart the command has run at most
 * once, the child's next turn is told its outcome is unknown and what the working directory shows, and the
 * parent gets exactly one result.
 */
const db = useTestDatabase();
const KEY = "CRW_TEST_CRASH_KEY";
const SLEEP = "31.7";
const COMMAND = `echo start >> markers.txt; sleep ${SLEEP}; echo end >> markers.txt`;
let models: ModelServer;
const made: string[] = [];
let daemon: DaemonProcess | undefined;

function answer(request: ModelRequest): ModelReply {
  const task = request.userTexts.join("\n");
  if (task.includes("LONG-WAIT") && request.toolResults.length === 0)
    return { tool: { name: "shell", arguments: { command: `sleep ${SLEEP}`, timeoutSeconds: 120 } } };
  if (!task.includes("MARKERS")) return { text: "noted" };
  const last = request.toolResults.at(-1);
  if (!last) return { tool: { name: "shell", arguments: { command: COMMAND, timeoutSeconds: 120 } } };
  return { text: `after the restart I was told: ${last.text}` };
}

beforeAll(async () => {
  models = await startModelServer(answer);
});

afterAll(async () => {
  daemon?.child.kill("SIGKILL");
  await daemon?.exited;
  await models?.close();
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

const start = (dataDir: string) =>
  spawnDaemon({
    dataDir,
    databaseUrl: db.url,
    env: {
      CRW_MODEL: "openai-completions:loopback",
      CRW_MODEL_BASE_URL: models.openaiBaseUrl,
      CRW_MODEL_API_KEY_ENV: KEY,
      [KEY]: "secret",
    },
  });

/**
 * The parent's delivered results from `childId`, once at least one arrived: a second delivery is given
 * every chance to show up before they are counted.
 */
async function resultsFrom(owner: TestClient, sessionId: string, childId: string) {
  const delivered = async () => {
    const read = await owner.ok<{ messages: { role: string; text?: string }[] }>("session.read", {
      sessionId,
    });
    return read.messages.filter((m) => m.text?.includes(`from child ${childId}`));
  };
  await waitFor(async () => (await delivered()).length > 0, "the child's one result", 60_000);
  await new Promise((r) => setTimeout(r, 1500));
  return delivered();
}

/** SIGKILL of the daemon; its runner and the sandboxed command go with it. */
async function killDaemon(): Promise<void> {
  daemon?.child.kill("SIGKILL");
  await daemon?.exited;
  await waitFor(() => sleepers().length === 0, "the sandboxed command to die with its runner", 15_000);
}

async function stop(): Promise<void> {
  if (!daemon) return;
  daemon.child.kill("SIGTERM");
  await daemon.exited;
  daemon = undefined;
}

const sleepers = () => {
  try {
    return execFileSync("pgrep", ["-f", `sleep ${SLEEP}`], { encoding: "utf8" })
      .trim()
      .split("\n")
      .filter(Boolean);
  } catch {
    return [];
  }
};

describe("a shell command cut off by a crash", () => {
  it("runs at most once across a SIGKILL of the daemon, and the parent gets exactly one result", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "crw-crash-daemon-"));
    const repo = mkdtempSync(join(tmpdir(), "crw-crash-repo-"));
    made.push(dataDir, repo);
    execFileSync("git", ["init", "-q", "-b", "main"], { cwd: repo });
    const markers = join(repo, "markers.txt");
    const lines = () => (existsSync(markers) ? readFileSync(markers, "utf8").trim().split("\n") : []);

    daemon = await start(dataDir);
    let owner = await TestClient.connect(daemon.url, daemon.token);
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", { cwd: repo });
    const receipt = await owner.ok<{ childSessionId: string }>("session.delegate", {
      sessionId,
      task: "MARKERS: run the command",
      background: true,
    });
    await waitFor(() => lines().includes("start"), "the command's first marker");
    owner.close();
    await killDaemon();
    // The runner and the sandbox went with the daemon: nothing of the command is left to write.
    expect(lines()).toEqual(["start"]);

    daemon = await start(dataDir);
    owner = await TestClient.connect(daemon.url, daemon.token);
    const results = await resultsFrom(owner, sessionId, receipt.childSessionId);
    expect(results).toHaveLength(1);
    expect(results[0]?.text).toMatch(/outcome is unknown/);
    expect(results[0]?.text).toMatch(/What the working directory shows now:[\s\S]*markers\.txt/);
    expect(lines()).toEqual(["start"]);
    owner.close();
    await stop();
  }, 180_000);

  it("a child whose working directory vanished while the daemon was down gets one typed error result on recovery", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "crw-crash-daemon-"));
    const repo = mkdtempSync(join(tmpdir(), "crw-crash-gone-"));
    made.push(dataDir, repo);
    daemon = await start(dataDir);
    let owner = await TestClient.connect(daemon.url, daemon.token);
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", { cwd: repo });
    const receipt = await owner.ok<{ childSessionId: string }>("session.delegate", {
      sessionId,
      task: "LONG-WAIT in the directory",
      background: true,
    });
    await waitFor(() => sleepers().length > 0, "the child's command to run");
    owner.close();
    await killDaemon();
    rmSync(repo, { recursive: true, force: true });

    daemon = await start(dataDir);
    owner = await TestClient.connect(daemon.url, daemon.token);
    const results = await resultsFrom(owner, sessionId, receipt.childSessionId);
    expect(results).toHaveLength(1);
    expect(results[0]?.text).toMatch(/error/);
    expect(results[0]?.text).toMatch(/working directory is not an existing readable directory/);
    expect(existsSync(repo)).toBe(false);
    owner.close();
    await stop();
  }, 180_000);
});
