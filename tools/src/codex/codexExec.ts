import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { runToEnd } from "../processes/index.js";
import { type CodexHomeOptions, codexNativeBin, writeCodexHome } from "./codexHome.js";

/**
 * `codex exec` (headless, one prompt) of the pinned `@openai/codex` 0.171.0, offline: its own CODEX_HOME
 * (codexHome.ts: mock Responses provider, approval_policy never, danger-full-access, plus
 * `[mcp_servers.*]`), `--json` events on stdout, the last agent message in `<home>/last-message.txt`.
 *
 * Facts seen with 0.171.0 (root, no network):
 * - Flags: `exec --json --skip-git-repo-check -C <cwd> -o <file> <prompt>`; stdin closed (it prints
 *   "Reading additional input from stdin..." and reads EOF). Root needs no extra flag: the config's
 *   sandbox_mode/approval_policy are enough. stderr's "could not create PATH aliases … under /tmp" is
 *   harmless.
 * - MCP tools reach the model as a Responses tool `{ type: "namespace", name: "mcp__<server>", tools: [{
 *   type: "function", name: "<tool>", parameters: <inputSchema>, strict: false }] }`, never deferred; the
 *   model calls `{ type: "function_call", namespace: "mcp__<server>", name: "<tool>", … }` (a flat
 *   `mcp__<server>__<tool>` name is "unsupported call"). The output comes back as a
 *   `function_call_output` whose `output` is `[{input_text "Wall time: N seconds\nOutput:"}, {input_text
 *   <the tool's text>}]`.
 * - tools/call carries `_meta: { progressToken, callId, threadId, sessionId, windowId, itemId,
 *   "x-codex-turn-metadata": {thread_id, turn_id, model, sandbox_mode, codex_version, …} }`;
 *   notifications/progress are accepted but do not extend `tool_timeout_sec`. On expiry the model gets
 *   "tool call error: tool call failed for `<server>/<tool>` … timed out awaiting tools/call after Ns".
 * - It does not wait for MCP servers unless `required = true` (CodexMcpServer.required): a server slower
 *   than a few hundred ms to answer initialize + tools/list is left out of the turn.
 * - `--json` events: thread.started {thread_id}, turn.started, item.started/item.completed (an
 *   `mcp_tool_call` item: server, tool, arguments, result {content, structured_content}, error, status),
 *   item.completed (agent_message), turn.completed {usage}.
 */

export interface CodexExecOptions extends Omit<CodexHomeOptions, "dir"> {
  /** CODEX_HOME of the run (config.toml, catalog, sessions); keep it short, under /tmp. */
  home: string;
  cwd: string;
  prompt: string;
  /** Added to (and overriding) the environment the kit builds. */
  env?: NodeJS.ProcessEnv;
  /** Killed (SIGKILL) after this long; default 60 s. */
  timeoutMs?: number;
  extraArgs?: string[];
}

export interface CodexExecRun {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The `--json` events, in order. */
  events: Array<Record<string, unknown>>;
  /** The last agent message (`-o`), or null when the turn wrote none. */
  lastMessage: string | null;
  stdout: string;
  stderr: string;
}

/** The parent's environment without what would point Codex at a real account or another home. */
function inheritedEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!/^(CODEX_|OPENAI_)/.test(k)) env[k] = v;
  return env;
}

function parseEvents(stdout: string): Array<Record<string, unknown>> {
  const events: Array<Record<string, unknown>> = [];
  for (const line of stdout.split("\n")) {
    if (!line.trim().startsWith("{")) continue;
    try {
      events.push(JSON.parse(line) as Record<string, unknown>);
    } catch {}
  }
  return events;
}

export async function runCodexExec(options: CodexExecOptions): Promise<CodexExecRun> {
  mkdirSync(options.home, { recursive: true });
  writeCodexHome({ ...options, dir: options.home });
  const lastPath = join(options.home, "last-message.txt");
  const args = ["exec", "--json", "--skip-git-repo-check", "-C", options.cwd, "-o", lastPath];
  const run = await runToEnd(codexNativeBin(), [...args, ...(options.extraArgs ?? []), options.prompt], {
    cwd: options.cwd,
    env: { ...inheritedEnv(), RUST_LOG: "warn", ...options.env, CODEX_HOME: options.home },
    timeoutMs: options.timeoutMs ?? 60_000,
  });
  const lastMessage = existsSync(lastPath) ? readFileSync(lastPath, "utf8") : null;
  return { ...run, events: parseEvents(run.stdout), lastMessage };
}
