import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { MCP_TOOLS_SERVER } from "@crw/tools/mcp";
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

/**
 * A model provider on loopback (OpenAI Chat Completions over SSE) reporting usage with cached prompt tokens:
 * a FORK-PARENT message asks for a fork of its session (60 of 100 prompt tokens cached); the fork's own
 * response reads 90 of 110 from the cache.
 */
const LOOPBACK_KEY = "CRW_CLI_TEST_LOOPBACK_KEY";
/** Resolved when a HOLD-NODE request reached the provider: its answer starts and never ends. */
let heldRequest: () => void = () => {};
const provider = createServer((req, res) => {
  let raw = "";
  req.on("data", (d) => {
    raw += d.toString();
  });
  req.on("end", () => {
    const messages = (JSON.parse(raw || "{}").messages ?? []) as { role: string; content?: unknown }[];
    const users = messages.filter((m) => m.role === "user").map((m) => JSON.stringify(m.content));
    const last = users.at(-1) ?? "";
    const toolRound = messages.some((m) => m.role === "tool");
    const chunk = (delta: object, finish: string | null, usage?: object) =>
      `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", created: 0, model: "cli-m", choices: [{ index: 0, delta, finish_reason: finish }], ...(usage && { usage }) })}\n\n`;
    const usage = (prompt: number, cached: number) => ({
      prompt_tokens: prompt,
      completion_tokens: 3,
      total_tokens: prompt + 3,
      prompt_tokens_details: { cached_tokens: cached },
    });
    let body: string;
    if (last.includes("HOLD-NODE")) {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(chunk({ role: "assistant", content: "thinking" }, null));
      heldRequest();
      return;
    }
    if (last.includes("FORK-PARENT") && !toolRound) {
      const call = {
        index: 0,
        id: "call-fork",
        type: "function",
        function: {
          name: "Delegate",
          arguments: JSON.stringify({ task: "FORK-TASK", fork: true, background: false }),
        },
      };
      body = chunk({ role: "assistant", tool_calls: [call] }, null) + chunk({}, "tool_calls", usage(100, 60));
    } else {
      const [text, u] = last.includes("FORK-TASK")
        ? ["fork answered", usage(110, 90)]
        : ["done", usage(120, 100)];
      body = chunk({ role: "assistant", content: text }, null) + chunk({}, "stop", u);
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.end(`${body}data: [DONE]\n\n`);
  });
});

beforeAll(async () => {
  await new Promise<void>((r) => provider.listen(0, "127.0.0.1", r));
  process.env[LOOPBACK_KEY] = "loopback-secret";
  // The daemon's configuration bridges a real MCP server (stdio, two tools) into every session.
  writeFileSync(
    join(dataDir, "daemon.json"),
    JSON.stringify({
      models: {
        baseUrls: { "openai-completions": `http://127.0.0.1:${(provider.address() as AddressInfo).port}/v1` },
        apiKeyEnv: { "openai-completions": LOOPBACK_KEY },
      },
      mcp: {
        servers: {
          calc: {
            command: process.execPath,
            args: [MCP_TOOLS_SERVER, "2"],
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
  provider.closeAllConnections();
  provider.close();
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
    const until = Date.now() + 60_000;
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
    // The first node's answer is held at the model, so the cancel surely finds it running and the rest
    // of the chain not started.
    const nodes = [
      { id: "n0", task: "HOLD-NODE", model: "openai-completions:cli-m" },
      { id: "n1", task: "step 1", dependsOn: ["n0"] },
      { id: "n2", task: "step 2", dependsOn: ["n1"] },
    ];
    writeFileSync(file, JSON.stringify({ name: "chain", nodes }));
    const held = new Promise<void>((r) => {
      heldRequest = r;
    });
    const started = await crw("workflow", "run", file, "--detach", ...at);
    expect(started.code, started.stderr).toBe(0);
    const id = started.stdout.trim();
    await held;
    const cancelled = await crw("workflow", "cancel", id, "--json", ...at);
    expect(cancelled.code, cancelled.stderr).toBe(0);
    const outcome = JSON.parse(cancelled.stdout) as { status: string; summary: string };
    expect(outcome.status).toBe("cancelled");
    expect(outcome.summary).toMatch(/- n0: interrupted while running/);
    expect(outcome.summary).toMatch(/- n1: cancelled before it started/);
    expect(outcome.summary).toMatch(/- n2: cancelled before it started/);
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
    expect(json.health.mcp).toEqual({
      servers: [
        {
          name: "calc",
          tools: 2,
          running: true,
          state: "running",
          restarts: 0,
          attempts: 0,
          lastError: null,
        },
      ],
    });
    expect(r.stdout).toMatch(/sub-agents: \d+\/\d+ runners, \d+ turns running, \d+ queued/);
    expect(r.stdout).toMatch(/boot recovery: 0 calls continued/);
    expect(r.stdout).toMatch(
      /runner processes: \d+ started, \d+ exited; sessions in runners: \d+ running, \d+ queued, \d+ idle; \d+ running in the daemon/,
    );
    expect(r.stdout).toMatch(/provider usage: \d+ responses/);
  });

  it("session fork-prefix tells whether a fork read its parent's cached prefix (human line and --json)", async () => {
    const created = await crw("session", "create", "--model", "openai-completions:cli-m", "--json", ...at);
    expect(created.code, created.stderr).toBe(0);
    const { sessionId } = JSON.parse(created.stdout) as { sessionId: string };
    const sent = await crw("session", "send", sessionId, "FORK-PARENT", "--json", ...at);
    expect(sent.code, sent.stderr).toBe(0);
    // The fork's session id, from the progress notification announcing it.
    const started = sent.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { notification?: string; type?: string; sessionId?: string })
      .find(
        (n) => n.notification === "session.progress" && n.type === "session" && n.sessionId !== sessionId,
      );
    const fork = started?.sessionId ?? "";
    expect(fork).toMatch(/^[0-9a-f-]{36}$/);

    const json = await crw("session", "fork-prefix", fork, "--json", ...at);
    expect(json.code, json.stderr).toBe(0);
    expect(JSON.parse(json.stdout)).toMatchObject({
      ok: true,
      sessionId: fork,
      parentSessionId: sessionId,
      fork: true,
      response: { promptTokens: 110, usage: { cacheRead: 90 } },
      parentResponse: { sessionId, promptTokens: 100, usage: { cacheRead: 60 } },
      parentCachedTokens: 60,
      prefixFromCache: true,
    });
    const human = await crw("session", "fork-prefix", fork, ...at);
    expect(human.code, human.stderr).toBe(0);
    expect(human.stdout).toMatch(
      new RegExp(
        `^fork ${fork} of ${sessionId} \\(inherited rows 1-\\d+\\): read its parent's prefix from the cache\n`,
      ),
    );
    expect(human.stdout).toMatch(/response: row \d+, cli-m, 110 prompt tokens, 90 read from cache \(82%\)/);
    expect(human.stdout).toMatch(
      /parent's request: row \d+, cli-m, 100 prompt tokens, 60 read from cache \(60%\)/,
    );
    // The root session itself is not a fork; its newest response is judged alone.
    const root = await crw("session", "fork-prefix", sessionId, ...at);
    expect(root.stdout).toMatch(
      /is not a fork; its newest provider response read 83% of its prompt from the cache/,
    );
    // A session without a provider response with usage (the offline scripted provider).
    const scripted = JSON.parse((await crw("session", "create", "--json", ...at)).stdout) as {
      sessionId: string;
    };
    const none = await crw("session", "fork-prefix", scripted.sessionId, ...at);
    expect(none.stdout).toMatch(/is not a fork and has no provider response with usage/);
    expect((await crw("session", "fork-prefix", ...at)).code).toBe(2);
    const unknown = await crw("session", "fork-prefix", "00000000-0000-4000-8000-000000000000", ...at);
    expect(unknown.code).toBe(1);
    const help = await crw("session", "--help");
    expect(help.stdout).toMatch(/fork-prefix SESSION/);
  });

  it("account and token commands: an account is made and granted tools, its token is printed once and works by --url, and a revoked one is refused", async () => {
    const made = await crw("account", "create", "alice", "--allow", "Read,Bash(git *)", "--json", ...at);
    expect(made.code, made.stderr).toBe(0);
    expect(JSON.parse(made.stdout)).toMatchObject({
      ok: true,
      name: "alice",
      allow: ["Read", "Bash(git *)"],
    });
    const granted = await crw("account", "grant", "alice", "--deny", "Bash(git push*)", ...at);
    expect(granted.code, granted.stderr).toBe(0);
    expect(granted.stdout).toMatch(
      /^alice\s+account\s+only Read, Bash\(git \*\), never Bash\(git push\*\)$/m,
    );
    const listed = await crw("account", "list", ...at);
    expect(listed.stdout).toMatch(/^owner\s+owner\s+every tool$/m);
    const issued = await crw("token", "issue", "alice", "--label", "laptop", ...at);
    expect(issued.code, issued.stderr).toBe(0);
    // stdout is the token alone (for a pipe); what it is and how to revoke it go to stderr
    const token = issued.stdout.trim();
    expect(token).toMatch(/^crw_[A-Za-z0-9_-]{32}$/);
    const id = /token ([0-9a-f]{12}) for alice/.exec(issued.stderr)?.[1] ?? "";
    expect(id).not.toBe("");
    const tokens = await crw("token", "list", "--json", ...at);
    expect(tokens.stdout).not.toContain(token);
    expect(JSON.parse(tokens.stdout).tokens).toContainEqual(
      expect.objectContaining({ id, account: "alice", label: "laptop", revokedAt: null }),
    );
    const url = JSON.parse(readFileSync(join(dataDir, "daemon.state.json"), "utf8")).url as string;
    // alice's token authenticates; alice is no administrator
    const asAlice = await crw("account", "list", "--url", url, "--token", token);
    expect(asAlice.code).toBe(1);
    expect(asAlice.stderr).toMatch(/only the owner and administrators manage accounts.*ask the owner/);
    const revoked = await crw("token", "revoke", id, ...at);
    expect(revoked).toMatchObject({ code: 0, stdout: `revoked ${id} of alice\n` });
    const after = await crw("account", "list", "--url", url, "--token", token);
    expect(after.code).toBe(1);
    expect(after.stderr).toMatch(/refused the token/);
    const bad = await crw("token", "revoke", "crw_not_an_id", ...at);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/not a token id/);
    const taken = await crw("account", "create", "alice", ...at);
    expect(taken.code).toBe(1);
    expect(taken.stderr).toMatch(/an account named alice exists/);
  });

  it("session background lets a foreground delegate go on in the background, its result delivered later; with nothing waiting it says so", async () => {
    const work = mkdtempSync(join(tmpdir(), "crw-client-cli-bg-"));
    const created = await crw("session", "create", "--cwd", work, ...at);
    expect(created.code, created.stderr).toBe(0);
    const session = created.stdout.trim();
    const idle = await crw("session", "background", session, ...at);
    expect(idle).toMatchObject({
      code: 0,
      stdout: `nothing of session ${session} waits in the foreground on this daemon\n`,
    });
    // a child that works for a while: its shell sleeps in the sandbox
    const script = steps(
      { toolCalls: [{ name: "shell", arguments: { command: "sleep 3" } }] },
      { text: "slept well" },
    );
    const fg = crw("session", "delegate", session, script, ...at);
    let moved = idle;
    const until = Date.now() + 30_000;
    while (!/goes on in the background/.test(moved.stdout)) {
      if (Date.now() > until) throw new Error(`nothing was moved: ${moved.stdout}${moved.stderr}`);
      await new Promise((r) => setTimeout(r, 100));
      moved = await crw("session", "background", session, ...at);
    }
    expect(moved).toMatchObject({
      code: 0,
      stdout: expect.stringMatching(/^delegated call \S+ goes on in the background\n$/),
    });
    const receipt = await fg;
    expect(receipt.code, receipt.stderr).toBe(0);
    expect(receipt.stdout).toMatch(/started in the background/);
    expect(receipt.stdout).not.toContain("slept well");
    const delivered = async () => {
      const read = await crw("session", "read", session, "--json", ...at);
      const doc = JSON.parse(read.stdout) as { messages: { role: string; text: string }[] };
      return doc.messages.some((m) => m.role === "custom" && m.text.includes("slept well"));
    };
    while (!(await delivered())) {
      if (Date.now() > until + 30_000) throw new Error("the backgrounded result never reached the session");
      await new Promise((r) => setTimeout(r, 200));
    }
    rmSync(work, { recursive: true, force: true });
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
