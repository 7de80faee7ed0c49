import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { type ModelServer, startModelServer } from "@crw/tools/models";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CRW_BIN, callTool, daemonPid, modelEnv, resultChildren, serveMcp } from "./support/mcpClient.js";

/**
 * The one gap between taking a result and the client seeing it that is crw's own: the daemon commits a
 * take and dies before its reply leaves. The daemon runs with a fault point that SIGKILLs it right after
 * the delivery transaction commits; the MCP server (which may not start a daemon itself here) asks again
 * once the test has started the daemon anew, and hands the result out as new, once.
 */
const run = promisify(execFile);
const root = mkdtempSync(join(tmpdir(), "crw-mcp-lost-"));
const dataDir = join(root, "daemon");
const work = join(root, "work");
let models: ModelServer;

const crw = (args: string[], env: Record<string, string>) =>
  run(process.execPath, [CRW_BIN, ...args], { env, timeout: 120_000 });

beforeAll(async () => {
  mkdirSync(work, { recursive: true });
  models = await startModelServer(() => ({ text: "the child's answer" }));
}, 60_000);

afterAll(async () => {
  await crw(["daemon", "stop", "--data-dir", dataDir], modelEnv(models.openaiBaseUrl)).catch(() => {});
  await models?.close();
  rmSync(root, { recursive: true, force: true });
}, 60_000);

describe("crw mcp and a lost reply", () => {
  it("a take the daemon committed but never answered is given once, as new, after the daemon is back", async () => {
    await crw(
      ["daemon", "start", "--data-dir", dataDir],
      modelEnv(models.openaiBaseUrl, { CRW_FAULT: "delivery.after_commit" }),
    );
    const crashing = daemonPid(dataDir);
    const served = await serveMcp({
      dataDir,
      session: "lost-reply",
      cwd: work,
      env: modelEnv(models.openaiBaseUrl),
      args: ["--no-start"],
    });
    try {
      const started = await callTool(served, "delegate", {
        task: "answer in the background",
        background: true,
      });
      const child = started.structuredContent?.childSessionId as string;
      const pending = callTool(served, "results", { wait_seconds: 60 });
      // The take commits and the daemon SIGKILLs itself before answering; a new one starts without the fault.
      await waitForExit(crashing);
      await crw(["daemon", "start", "--data-dir", dataDir], modelEnv(models.openaiBaseUrl));
      const got = await pending;
      expect(got.isError, JSON.stringify(got.content)).toBeFalsy();
      expect(resultChildren(got)).toEqual([child]);
      expect(got.structuredContent?.results).toEqual([expect.objectContaining({ alreadyTaken: false })]);
      expect((await callTool(served, "results")).structuredContent?.results).toEqual([]);
    } finally {
      await served.client.close().catch(() => {});
    }
  }, 120_000);
});

async function waitForExit(pid: number): Promise<void> {
  const until = Date.now() + 60_000;
  for (;;) {
    try {
      process.kill(pid, 0);
    } catch {
      return;
    }
    if (Date.now() > until) throw new Error(`daemon ${pid} did not die at its fault point`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
