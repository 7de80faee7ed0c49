import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { runToEnd } from "../processes/index.js";

/**
 * The real Claude Code binary (`@anthropic-ai/claude-code` 2.1.328) run headless and offline as an MCP
 * client: `claude -p <prompt>` against a mock Anthropic Messages server (ANTHROPIC_BASE_URL), with the MCP
 * servers of a config file this kit writes (`--mcp-config <file> --strict-mcp-config`, so nothing from the
 * user's `~/.claude.json` or a project `.mcp.json` comes in).
 *
 * Facts seen with 2.1.328 (root, no network):
 * - `-p` skips onboarding and the workspace trust dialog: an empty HOME is enough, nothing to pre-write.
 * - stdin must be closed (`ignore`): with an open pipe it waits 3 s for stdin data ("no stdin data
 *   received in 3s").
 * - Root: `--dangerously-skip-permissions` exits 1 ("cannot be used with root/sudo privileges") unless
 *   IS_SANDBOX=1 is set. `--allowedTools mcp__<server>` (a whole server) works as root without it. With
 *   neither, an MCP call in `-p` is denied: the model gets "Claude requested permissions to use …" and the
 *   result lists it in `permission_denials`, exit code still 0.
 * - MCP tools are named `mcp__<server>__<tool>` (Anthropic `tools[].name`, `input_schema` = the server's
 *   inputSchema). By default they are DEFERRED behind ToolSearch: `tools` holds only the built-ins plus a
 *   `DeferredToolPlaceholder` (`defer_loading: true`), and the system prompt lists the MCP tool names
 *   ("available via ToolSearch"). ENABLE_TOOL_SEARCH=false puts them directly into `tools`. (A direct
 *   tool_use of a deferred MCP tool still ran in 2.1.328, but the kit does not rely on that.)
 * - A tool result comes back as a user `tool_result` block, content `[{type:"text", text}]`; an error
 *   (timeout, denial) as a string content with `is_error: true`.
 * - The MCP server inherits Claude's whole environment (no whitelist) plus the config's `env`, and starts in
 *   Claude's cwd. It also gets CLAUDECODE=1, CLAUDE_CODE_SESSION_ID, CLAUDE_PROJECT_DIR (= cwd),
 *   CLAUDE_CODE_ENTRYPOINT=sdk-cli, AI_AGENT=claude-code_2-1-328_harness.
 * - tools/call carries `_meta: { progressToken, "claudecode/toolUseId" }`; notifications/progress are
 *   accepted (no error) but do not extend the call's timeout.
 * - `-p` waits for every MCP server to connect (up to the startup timeout) before its first request: a
 *   server that took 4 s to start was still offered in the first request.
 * - Timeouts: startup MCP_TIMEOUT (debug log: "Starting connection with timeout of 30000ms" by default);
 *   a tool call MCP_TOOL_TIMEOUT (ms, env) or a per-server `"timeout": <ms>` in the MCP config. On expiry
 *   the model gets `MCP server "<s>" tool "<t>" timed out after Ns` (is_error).
 * - `--output-format stream-json` with `-p` needs `--verbose`.
 * - Requests: `POST /v1/messages?beta=true`, `stream: true`, headers `x-api-key`, `anthropic-version`,
 *   `x-claude-code-session-id`; model `claude-opus-5-5` unless `--model`. With
 *   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 a one-tool run made exactly two requests (no count_tokens,
 *   no side requests), but the mock answers `/v1/messages/count_tokens` anyway.
 */

export interface ClaudeMcpServer {
  command: string;
  args?: string[];
  env?: Record<string, string>;
  /** Per-server tool-call timeout in ms (the config's `timeout`; MCP_TOOL_TIMEOUT is the global one). */
  timeoutMs?: number;
}

export interface RunClaudeOptions {
  /**
   * HOME of the run: Claude keeps `.claude.json`, `.claude/` (sessions, settings) there, and its temporary
   * files (`claude-<uid>/`, `cc-socks/`) in `<home>/tmp` (CLAUDE_CODE_TMPDIR), which go with the home.
   */
  home: string;
  cwd: string;
  prompt: string;
  /** The mock's Anthropic base URL (no /v1: the client adds /v1/messages). */
  baseUrl: string;
  mcpServers?: Record<string, ClaudeMcpServer>;
  /** Added to (and overriding) the environment the kit builds. */
  env?: NodeJS.ProcessEnv;
  /** Killed (SIGKILL) after this long; default 60 s. */
  timeoutMs?: number;
  /** Keep Claude's ToolSearch deferral of MCP tools (default false: MCP tools sit directly in `tools`). */
  deferMcpTools?: boolean;
  /**
   * How MCP tools are let through: `skip` (default) = `--dangerously-skip-permissions` with IS_SANDBOX=1
   * (needed as root); `allow` = `--allowedTools mcp__<server>` for each configured server.
   */
  permissions?: "skip" | "allow";
  outputFormat?: "json" | "stream-json";
  /** Claude's debug log (`--debug-file`), e.g. `<home>/claude-debug.log`. */
  debugFile?: string;
  extraArgs?: string[];
}

export interface ClaudeRun {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The `{type:"result"}` object (json: the whole stdout; stream-json: its last result line). */
  result: Record<string, unknown> | null;
  /** stream-json: every line parsed; json: just the result. */
  events: Array<Record<string, unknown>>;
  stdout: string;
  stderr: string;
  mcpConfigPath: string;
}

/** The native binary of the pinned package (the platform package's `claude`), else the npm shim. */
export function claudeBin(): string {
  const require = createRequire(import.meta.url);
  const root = dirname(require.resolve("@anthropic-ai/claude-code/package.json"));
  const arch = process.arch === "arm64" ? "arm64" : "x64";
  try {
    const pkg = require.resolve(`@anthropic-ai/claude-code-linux-${arch}/package.json`, { paths: [root] });
    const native = join(dirname(pkg), "claude");
    if (existsSync(native)) return native;
  } catch {}
  return join(root, "bin", "claude.exe");
}

/**
 * The MCP config in Claude's own format: what `claude mcp add -s user <name> -e K=V -- cmd args` writes
 * under `mcpServers` of `~/.claude.json` (and `-s project` into `<cwd>/.mcp.json`).
 */
export function claudeMcpConfig(servers: Record<string, ClaudeMcpServer>): {
  mcpServers: Record<string, Record<string, unknown>>;
} {
  const mcpServers: Record<string, Record<string, unknown>> = {};
  for (const [name, s] of Object.entries(servers)) {
    mcpServers[name] = {
      type: "stdio",
      command: s.command,
      args: s.args ?? [],
      env: s.env ?? {},
      ...(s.timeoutMs !== undefined && { timeout: s.timeoutMs }),
    };
  }
  return { mcpServers };
}

/** The parent's environment without what would point Claude at a real account or a parent session. */
function inheritedEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!/^(ANTHROPIC_|CLAUDE|MCP_|ENABLE_TOOL_SEARCH$|IS_SANDBOX$)/.test(k)) env[k] = v;
  }
  return env;
}

/** Where Claude keeps its temporary files instead of the system's temporary directory. */
const claudeTmp = (home: string) => join(home, "tmp");

function claudeEnv(options: RunClaudeOptions): NodeJS.ProcessEnv {
  return {
    ...inheritedEnv(),
    HOME: options.home,
    CLAUDE_CODE_TMPDIR: claudeTmp(options.home),
    ANTHROPIC_BASE_URL: options.baseUrl,
    ANTHROPIC_API_KEY: "sk-ant-test-offline",
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
    DISABLE_TELEMETRY: "1",
    DISABLE_AUTOUPDATER: "1",
    DISABLE_ERROR_REPORTING: "1",
    ...(options.deferMcpTools ? {} : { ENABLE_TOOL_SEARCH: "false" }),
    ...((options.permissions ?? "skip") === "skip" ? { IS_SANDBOX: "1" } : {}),
    ...options.env,
  };
}

function claudeArgs(options: RunClaudeOptions, mcpConfigPath: string): string[] {
  const format = options.outputFormat ?? "json";
  const servers = Object.keys(options.mcpServers ?? {});
  const permission =
    (options.permissions ?? "skip") === "skip"
      ? ["--dangerously-skip-permissions"]
      : servers.length > 0
        ? ["--allowedTools", servers.map((s) => `mcp__${s}`).join(",")]
        : [];
  return [
    "-p",
    options.prompt,
    "--output-format",
    format,
    ...(format === "stream-json" ? ["--verbose"] : []),
    "--mcp-config",
    mcpConfigPath,
    "--strict-mcp-config",
    ...permission,
    ...(options.debugFile ? ["--debug-file", options.debugFile] : []),
    ...(options.extraArgs ?? []),
  ];
}

function parseOutput(stdout: string): Pick<ClaudeRun, "result" | "events"> {
  const events: Array<Record<string, unknown>> = [];
  for (const line of stdout.split("\n")) {
    if (!line.trim().startsWith("{")) continue;
    try {
      events.push(JSON.parse(line) as Record<string, unknown>);
    } catch {}
  }
  return { events, result: events.filter((e) => e.type === "result").at(-1) ?? null };
}

export async function runClaude(options: RunClaudeOptions): Promise<ClaudeRun> {
  mkdirSync(options.home, { recursive: true });
  mkdirSync(claudeTmp(options.home), { recursive: true, mode: 0o700 });
  const mcpConfigPath = join(options.home, "crw-mcp-config.json");
  writeFileSync(mcpConfigPath, JSON.stringify(claudeMcpConfig(options.mcpServers ?? {}), null, 2));
  const run = await runToEnd(claudeBin(), claudeArgs(options, mcpConfigPath), {
    cwd: options.cwd,
    env: claudeEnv(options),
    timeoutMs: options.timeoutMs ?? 60_000,
  });
  return { ...run, mcpConfigPath, ...parseOutput(run.stdout) };
}
