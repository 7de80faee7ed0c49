import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { type ClaudeMcpServer, runClaude } from "@crw/tools/claude";
import { runCodexExec } from "@crw/tools/codex";
import {
  type ModelReply,
  type ModelRequest,
  type ModelServer,
  mcpToolCall,
  mcpToolsOffered,
  startModelServer,
} from "@crw/tools/models";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * The real Codex (`codex exec`) and the real Claude Code (`claude -p`), offline, as MCP clients of crw: each
 * is configured by `crw mcp install`, and its owner model (a mock on 127.0.0.1 speaking Responses or
 * Anthropic Messages) delegates in the background with a directory, checks `status` while the child works,
 * then collects the answer with `results`. The children run on the daemon's own model (the same mock,
 * speaking Chat Completions) and write the file they were asked to.
 */
const run = promisify(execFile);
const bin = resolve(import.meta.dirname, "../bin/crw.mjs");
// Short, under /tmp: Codex's unix sockets under CODEX_HOME must stay under ~107 bytes.
const root = mkdtempSync(join(tmpdir(), "crw-mh-"));
const dataDir = join(root, "daemon");
const KEY = "CRW_MCP_HOSTS_KEY";
let models: ModelServer;

/** The daemon's children: "write FILE: TEXT" is done with the write tool, then answered. */
function child(request: ModelRequest): ModelReply {
  const task = request.userTexts.join("\n");
  const write = /write (\S+): (.+)/.exec(task);
  if (request.toolResults.length > 0) return { text: `CHILD-DONE wrote ${write?.[1]}` };
  if (write) return { tool: { name: "write", arguments: { path: write[1], content: `${write[2]}\n` } } };
  return { text: "CHILD-DONE nothing to write" };
}

/** The owner: delegate (background, with a cwd), keep working (`status`), collect with `results`, answer. */
function owner(workDir: string, file: string) {
  return (request: ModelRequest): ModelReply => {
    if (!mcpToolsOffered(request).some((t) => t.server === "crw" && t.tool === "delegate"))
      return { text: "crw's tools were not offered" };
    const done = request.toolResults.length;
    if (done === 0)
      return mcpToolCall(request, "crw", "delegate", {
        task: `write ${file}: edited by a crw child`,
        cwd: workDir,
        background: true,
      });
    if (done === 1) return mcpToolCall(request, "crw", "status", {});
    if (done === 2) return mcpToolCall(request, "crw", "results", { wait_seconds: 60 });
    const collected = request.toolResults[2]?.text ?? "";
    return { text: collected.includes("CHILD-DONE") ? `OWNER-GOT ${collected}` : "OWNER-MISSED" };
  };
}

function answer(request: ModelRequest): ModelReply | Promise<ModelReply> {
  if (request.protocol === "openai-completions") return child(request);
  const route = routes.get(request.protocol);
  return route ? route(request) : { text: "no owner for this protocol" };
}
const routes = new Map<string, (r: ModelRequest) => ModelReply>();

function daemonEnv(): NodeJS.ProcessEnv {
  const e: NodeJS.ProcessEnv = {
    ...process.env,
    CRW_MODEL: "openai-completions:loopback",
    CRW_MODEL_BASE_URL: models.openaiBaseUrl,
    CRW_MODEL_API_KEY_ENV: KEY,
    [KEY]: "secret",
    // Any free port: the files of this project run two at a time, each with daemons of its own.
    CRW_DAEMON_PORT: "0",
  };
  return e;
}

async function crw(args: string[], env: NodeJS.ProcessEnv = daemonEnv()) {
  return run(process.execPath, [bin, ...args], { env, timeout: 120_000 });
}

/** `crw mcp install` into `config`, for the test's daemon and a session of its own. */
const install = (client: "codex" | "claude", config: string, session: string) =>
  crw(["mcp", "install", client, "--config", config, "--data-dir", dataDir, "--session", session]);

function scratch(name: string) {
  const dir = join(root, name);
  const home = join(dir, "h");
  const work = join(dir, "w");
  mkdirSync(home, { recursive: true });
  mkdirSync(work, { recursive: true });
  return { dir, home, work };
}

beforeAll(async () => {
  models = await startModelServer(answer);
  await crw(["daemon", "start", "--data-dir", dataDir]);
}, 120_000);

afterAll(async () => {
  await crw(["daemon", "stop", "--data-dir", dataDir]).catch(() => {});
  await models?.close();
  rmSync(root, { recursive: true, force: true });
}, 60_000);

/** The owner's collected answer reached its model, and the child's file is on disk. */
function expectDelegatedWork(protocol: string, work: string, file: string): void {
  const owned = models.requests.filter((r) => r.protocol === protocol);
  const last = owned.at(-1) as ModelRequest;
  expect(last.toolResults).toHaveLength(3);
  expect(last.toolResults[0]?.text).toContain("works in the background");
  expect(last.toolResults[2]?.text).toContain(`CHILD-DONE wrote ${file}`);
  expect(readFileSync(join(work, file), "utf8")).toBe("edited by a crw child\n");
}

describe("real MCP clients delegate to crw", () => {
  it("Codex delegates in the background with a directory and collects the child's answer with results", async () => {
    const s = scratch("codex");
    const config = join(s.dir, "crw.toml");
    await install("codex", config, "codex-owner");
    routes.set("openai-responses", owner(s.work, "CODEX.md"));
    const exec = await runCodexExec({
      home: s.home,
      cwd: s.work,
      prompt: "delegate the note to crw",
      baseUrl: models.openaiBaseUrl,
      extraToml: `\n${readFileSync(config, "utf8")}`,
      timeoutMs: 110_000,
    });
    expect(exec.code, exec.stderr).toBe(0);
    expect(exec.lastMessage).toContain("OWNER-GOT");
    expectDelegatedWork("openai-responses", s.work, "CODEX.md");
  }, 120_000);

  it("Claude Code delegates in the background with a directory and collects the child's answer with results", async () => {
    const s = scratch("claude");
    const config = join(s.dir, "mcp.json");
    await install("claude", config, "claude-owner");
    const installed = JSON.parse(readFileSync(config, "utf8")) as {
      mcpServers: { crw: ClaudeMcpServer & { timeout?: number } };
    };
    routes.set("anthropic-messages", owner(s.work, "CLAUDE.md"));
    const { timeout, ...server } = installed.mcpServers.crw;
    const claude = await runClaude({
      home: s.home,
      cwd: s.work,
      prompt: "delegate the note to crw",
      baseUrl: models.anthropicBaseUrl,
      mcpServers: { crw: { ...server, ...(timeout && { timeoutMs: timeout }) } },
      timeoutMs: 110_000,
    });
    expect(claude.code, claude.stderr).toBe(0);
    expect(claude.result).toMatchObject({ is_error: false });
    expect(String(claude.result?.result)).toContain("OWNER-GOT");
    expectDelegatedWork("anthropic-messages", s.work, "CLAUDE.md");
  }, 120_000);
});
