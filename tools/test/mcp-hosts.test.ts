import { randomUUID } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { runClaude } from "../src/claude/index.js";
import { runCodexExec } from "../src/codex/index.js";
import { MCP_TOOLS_SERVER } from "../src/mcp/index.js";
import {
  type ModelRequest,
  type ModelServer,
  mcpToolCall,
  mcpToolsOffered,
  startModelServer,
} from "../src/models/index.js";

/**
 * Both real agent binaries as MCP clients, offline: the mock model's first reply calls `echo` of the test
 * MCP server, the second (once the tool result is in the request) is plain text. The server is started
 * through `sh -c 'env > FILE; exec node tools-server.mjs 2'` so the test also sees the environment each
 * binary gives a server it spawns.
 */

const dirs: string[] = [];
let models: ModelServer | null = null;

afterEach(async () => {
  await models?.close();
  models = null;
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function scratch(): { root: string; home: string; cwd: string; envFile: string } {
  // Short, under /tmp: Codex's unix sockets under CODEX_HOME must stay under ~107 bytes.
  const root = mkdtempSync(join(tmpdir(), "crw-mh-"));
  dirs.push(root);
  const home = join(root, "home");
  const cwd = join(root, "work");
  mkdirSync(home);
  mkdirSync(cwd);
  return { root, home, cwd, envFile: join(root, "mcp-env.txt") };
}

/** The test MCP server behind a shell that writes its environment to `envFile` first. */
function toolsServer(envFile: string) {
  return {
    command: "sh",
    args: ["-c", 'env > "$0"; exec "$1" "$2" 2', envFile, process.execPath, MCP_TOOLS_SERVER],
    env: { CRW_FROM_CONFIG: "config" },
  };
}

/** First a call of tools/echo, then (with its result in the request) plain text. */
function owner(marker: string) {
  return (request: ModelRequest) => {
    const offered = mcpToolsOffered(request).some((t) => t.server === "tools" && t.tool === "echo");
    if (offered && request.toolResults.length === 0)
      return mcpToolCall(request, "tools", "echo", { text: marker });
    return { text: "done" };
  };
}

function envOf(file: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const line of readFileSync(file, "utf8").split("\n")) {
    const at = line.indexOf("=");
    if (at > 0) env[line.slice(0, at)] = line.slice(at + 1);
  }
  return env;
}

function expectEchoReachedModel(requests: readonly ModelRequest[], marker: string): void {
  expect(requests.length).toBeGreaterThanOrEqual(2);
  expect(mcpToolsOffered(requests[0] as ModelRequest)).toContainEqual({ server: "tools", tool: "echo" });
  const after = requests.find((r) => r.toolResults.length > 0);
  expect(after?.toolResults.map((t) => t.text).join("\n")).toContain(marker);
}

describe("real agent binaries as MCP clients", () => {
  it("Claude Code calls an MCP tool and sees its result", async () => {
    const s = scratch();
    const marker = `claude-${randomUUID()}`;
    models = await startModelServer(owner(marker));
    const run = await runClaude({
      home: s.home,
      cwd: s.cwd,
      prompt: "echo the marker",
      baseUrl: models.anthropicBaseUrl,
      mcpServers: { tools: toolsServer(s.envFile) },
      env: { CRW_PARENT_ONLY: "parent" },
      timeoutMs: 50_000,
    });
    expect(run.code, run.stderr).toBe(0);
    expect(run.result).toMatchObject({ type: "result", is_error: false, result: "done" });
    expect(run.result?.permission_denials).toEqual([]);
    expectEchoReachedModel(models.requests, marker);
    // Claude passes its whole environment through, plus the config's env.
    const env = envOf(s.envFile);
    expect(env).toMatchObject({ CRW_FROM_CONFIG: "config", CRW_PARENT_ONLY: "parent", HOME: s.home });
    expect(env.PWD).toBe(s.cwd);
  }, 60_000);

  it("Claude Code as root runs MCP tools allowed by --allowedTools, without IS_SANDBOX", async () => {
    const s = scratch();
    const marker = `claude-allow-${randomUUID()}`;
    models = await startModelServer(owner(marker));
    const run = await runClaude({
      home: s.home,
      cwd: s.cwd,
      prompt: "echo the marker",
      baseUrl: models.anthropicBaseUrl,
      mcpServers: { tools: toolsServer(s.envFile) },
      permissions: "allow",
      timeoutMs: 50_000,
    });
    expect(run.code, run.stderr).toBe(0);
    expect(run.result?.permission_denials).toEqual([]);
    expectEchoReachedModel(models.requests, marker);
  }, 60_000);

  it("codex exec calls an MCP tool and sees its result", async () => {
    const s = scratch();
    const marker = `codex-${randomUUID()}`;
    models = await startModelServer(owner(marker));
    const run = await runCodexExec({
      home: s.home,
      cwd: s.cwd,
      prompt: "echo the marker",
      baseUrl: models.openaiBaseUrl,
      // required: else codex exec sends its first request without waiting for the server's tools.
      mcpServers: { tools: { ...toolsServer(s.envFile), required: true, toolTimeoutSec: 30 } },
      env: { CRW_PARENT_ONLY: "parent" },
      timeoutMs: 50_000,
    });
    expect(run.code, run.stderr).toBe(0);
    expect(run.lastMessage?.trim()).toBe("done");
    const call = run.events.find(
      (e) => e.type === "item.completed" && (e.item as { type?: string }).type === "mcp_tool_call",
    );
    expect(call?.item).toMatchObject({ server: "tools", tool: "echo", status: "completed" });
    expectEchoReachedModel(models.requests, marker);
    // Codex passes only a whitelist of its environment (not CODEX_HOME, not app variables), plus env.
    const env = envOf(s.envFile);
    expect(env.CRW_FROM_CONFIG).toBe("config");
    expect(env.CRW_PARENT_ONLY).toBeUndefined();
    expect(env.CODEX_HOME).toBeUndefined();
    expect(env.PWD).toBe(s.cwd);
  }, 60_000);
});
