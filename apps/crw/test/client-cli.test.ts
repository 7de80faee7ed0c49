import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * The client commands as a user runs them: the built `crw` against a daemon started with `crw daemon start`
 * on its own embedded PostgreSQL (default forked runners, offline scripted provider).
 */
const run = promisify(execFile);
const bin = resolve(import.meta.dirname, "../bin/crw.mjs");
const root = resolve(import.meta.dirname, "../../..");
const dataDir = mkdtempSync(join(tmpdir(), "crw-client-cli-"));
const steps = (...list: object[]) => JSON.stringify({ steps: list });

async function crw(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const env = { ...process.env };
  delete env.DATABASE_URL;
  try {
    const { stdout, stderr } = await run(process.execPath, [bin, ...args], {
      env,
      cwd: root,
      timeout: 120_000,
    });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}
const at = ["--data-dir", dataDir];

beforeAll(async () => {
  // The daemon's configuration bridges a real MCP server (stdio, two tools) into every session.
  writeFileSync(
    join(dataDir, "daemon.json"),
    JSON.stringify({
      mcp: {
        servers: {
          calc: {
            command: process.execPath,
            args: [resolve(root, "apps/daemon/test/e2e/parity-mcp-server.mjs"), "2"],
          },
        },
      },
      tools: { maxDirectTools: 16 },
    }),
  );
  const r = await crw("daemon", "start", ...at, "--port", "0");
  expect(r.code, r.stderr).toBe(0);
}, 120_000);
afterAll(async () => {
  await crw("daemon", "stop", ...at);
  const pidFile = join(dataDir, "postgres", "postmaster.pid");
  if (existsSync(pidFile)) {
    try {
      process.kill(Number(readFileSync(pidFile, "utf8").split("\n")[0]), "SIGKILL");
    } catch {}
  }
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

describe("crw workflow | session | tap against a running daemon", () => {
  it("workflow run submits the example, shows progress per node and prints the whole-workflow summary", async () => {
    const r = await crw("workflow", "run", "examples/daemon/review.yaml", ...at);
    expect(r.code, r.stderr).toBe(0);
    for (const id of ["plan", "api", "docs", "review", "release-notes"])
      expect(r.stdout).toMatch(new RegExp(`${id}\\s+succeeded`));
    expect(r.stdout).toMatch(/Workflow "review-and-document" \(.+\) completed, run 1\./);
    expect(r.stdout).toContain("- release-notes: succeeded");
  });

  it("workflow run --json prints notifications as JSON lines, then the outcome", async () => {
    const r = await crw("workflow", "run", "examples/daemon/review.yaml", "--json", ...at);
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.filter((l) => l.notification === "workflow.progress").length).toBeGreaterThanOrEqual(5);
    expect(lines.at(-1)).toMatchObject({
      ok: true,
      status: "completed",
      summary: expect.stringContaining("completed"),
    });
  });

  it("a definition with a cycle is refused with what to do, exit 1, nothing started", async () => {
    const file = join(dataDir, "cycle.yaml");
    writeFileSync(
      file,
      "name: c\nnodes:\n  - {id: a, task: t, dependsOn: [b]}\n  - {id: b, task: t, dependsOn: [a]}\n",
    );
    const r = await crw("workflow", "run", file, ...at);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/cycle.*fix the definition file/s);
  });

  it("session send, delegate, read and tap", async () => {
    const created = await crw("session", "create", ...at);
    expect(created.code, created.stderr).toBe(0);
    const session = created.stdout.trim();
    const sent = await crw("session", "send", session, "hello there", ...at);
    expect(sent).toMatchObject({ code: 0, stdout: "Done: hello there\n" });
    const fg = await crw("session", "delegate", session, steps({ text: "child says hi" }), ...at);
    expect(fg).toMatchObject({ code: 0, stdout: "child says hi\n" });
    const bg = await crw(
      "session",
      "delegate",
      session,
      steps({ text: "background child done" }),
      "--background",
      "--json",
      ...at,
    );
    expect(bg.code, bg.stderr).toBe(0);
    const receipt = JSON.parse(bg.stdout.trim().split("\n").at(-1) as string) as {
      kind: string;
      childSessionId: string;
    };
    expect(receipt.kind).toBe("started");
    const tap = await crw("tap", receipt.childSessionId, "--until-idle", "--json", ...at);
    expect(tap.code, tap.stderr).toBe(0);
    const events = tap.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { message?: { role: string; text: string } });
    expect(
      events.some((e) => e.message?.role === "assistant" && e.message.text === "background child done"),
    ).toBe(true);
    // A delegation made through the API (no tool call of the parent) reaches the parent as a delivered result,
    // journaled by the parent's follow-up turn (which may still be running).
    const delivered = async () => {
      const read = await crw("session", "read", session, "--json", ...at);
      const doc = JSON.parse(read.stdout) as { messages: { role: string; text: string }[] };
      return doc.messages.some((m) => m.role === "custom" && m.text.includes("child says hi"));
    };
    const until = Date.now() + 20_000;
    while (!(await delivered())) {
      if (Date.now() > until) throw new Error("the foreground result never reached the parent's journal");
      await new Promise((r) => setTimeout(r, 200));
    }
    // Where the finished child executes now: routed to a runner, idle, no open call.
    const status = await crw("session", "status", receipt.childSessionId, "--json", ...at);
    expect(status.code, status.stderr).toBe(0);
    expect(JSON.parse(status.stdout)).toMatchObject({
      ok: true,
      sessionId: receipt.childSessionId,
      kind: "delegated",
      parentSessionId: session,
      execution: { location: "runner", state: "idle" },
      delegation: null,
    });
    const human = await crw("session", "status", receipt.childSessionId, ...at);
    expect(human.stdout).toMatch(/child of .*: in runner-\d+ \(idle\)/);
    expect((await crw("session", "status", ...at)).code).toBe(2);
  });

  it("workflow cancel stops a running workflow: one summary says which nodes were interrupted and which never started", async () => {
    const file = join(dataDir, "chain.json");
    const nodes = Array.from({ length: 150 }, (_, i) => ({
      id: `n${i}`,
      task: `step ${i}`,
      ...(i > 0 ? { dependsOn: [`n${i - 1}`] } : {}),
    }));
    writeFileSync(file, JSON.stringify({ name: "chain", nodes }));
    const started = await crw("workflow", "run", file, "--detach", ...at);
    expect(started.code, started.stderr).toBe(0);
    const id = started.stdout.trim();
    const cancelled = await crw("workflow", "cancel", id, "--json", ...at);
    expect(cancelled.code, cancelled.stderr).toBe(0);
    const outcome = JSON.parse(cancelled.stdout) as { status: string; summary: string };
    expect(outcome.status).toBe("cancelled");
    expect(outcome.summary).toMatch(/cancelled before it started/);
    const status = await crw("workflow", "status", id, "--json", ...at);
    expect(JSON.parse(status.stdout)).toMatchObject({ status: "cancelled" });
  });

  it("daemon status shows the runner pool, queue, boot recovery and the configured MCP servers with their tool counts", async () => {
    const r = await crw("daemon", "status", ...at);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain("MCP servers: calc (2 tools)");
    const json = JSON.parse((await crw("daemon", "status", "--json", ...at)).stdout) as {
      health: { mcp: unknown };
    };
    expect(json.health.mcp).toEqual({ servers: [{ name: "calc", tools: 2, running: true }] });
    expect(r.stdout).toMatch(/sub-agents: \d+\/\d+ runners, \d+ turns running, \d+ queued/);
    expect(r.stdout).toMatch(/boot recovery: 0 calls continued/);
    expect(r.stdout).toMatch(/runner processes: \d+ started, \d+ exited; sessions executing: \d+ in runners/);
    expect(r.stdout).toMatch(/provider usage in runners: \d+ responses/);
  });

  it("errors say what to do: unknown session (1), missing arguments (2), no daemon (1)", async () => {
    const unknown = await crw("session", "read", "00000000-0000-4000-8000-000000000000", ...at);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/not found.*crw session create/s);
    const missing = await crw("session", "send", ...at);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toMatch(/needs SESSION and TEXT/);
    const none = await crw("session", "create", "--data-dir", join(dataDir, "nowhere"));
    expect(none.code).toBe(1);
    expect(none.stderr).toMatch(/no daemon runs on .*crw daemon start/);
    const badOption = await crw("tap", "--bogus", ...at);
    expect(badOption.code).toBe(2);
  });
});
