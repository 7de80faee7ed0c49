import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

/**
 * A CODEX_HOME of a test's own for the real `codex` binary, offline: config.toml pointing the model
 * provider at a mock Responses server, and a model catalog cloned from the bundled one under the mock
 * model names (a model unknown to the catalog refuses a spawn's reasoning effort).
 */

export interface CodexHomeOptions {
  dir: string;
  /** The mock model's base URL (`…/v1`). */
  baseUrl: string;
  /** The owner's model; every name in `models` gets a catalog entry. */
  model?: string;
  models?: string[];
  /** The bundled entry cloned under the mock names (one with the multi-agent v1 tools, not code mode). */
  template?: string;
  /** Extra TOML appended to config.toml (e.g. `[agents]` or hooks). */
  extraToml?: string;
  /** `[mcp_servers.<name>]` tables (stdio servers), written before `extraToml`. */
  mcpServers?: Record<string, CodexMcpServer>;
}

/**
 * One `[mcp_servers.<name>]` table. Seen with 0.171.0: the server gets only a whitelist of Codex's own
 * environment (HOME, PATH with Codex's `codex-path` dir prepended, USER, LOGNAME, SHELL, LANG, LC_ALL,
 * TERM, TMPDIR, TZ; not CODEX_HOME, XDG_RUNTIME_DIR nor any app variable), plus `env` (applied), plus the
 * names in `env_vars` copied from Codex's environment. It starts in `cwd`, else in Codex's cwd.
 */
export interface CodexMcpServer {
  command: string;
  args?: string[];
  /** Set in the server's environment (`env = { K = "V" }`). */
  env?: Record<string, string>;
  /** Names passed through from Codex's own environment (`env_vars = [...]`), e.g. CODEX_HOME. */
  envVars?: string[];
  cwd?: string;
  /**
   * `required = true`: the session waits for this server's handshake before the first model request, and
   * fails to start ("required MCP servers failed to initialize", exit 1) if it cannot start. Without it
   * `codex exec` does not wait: a server that takes ~1 s to answer initialize + tools/list is missing
   * from the whole turn (its calls are "unsupported call").
   */
  required?: boolean;
  /** initialize + tools/list must answer within it (documented default 10 s). */
  startupTimeoutSec?: number;
  /**
   * Bound of one tools/call; progress notifications do not extend it. With it unset a 130 s call (no
   * progress) still completed: set it explicitly rather than rely on a default.
   */
  toolTimeoutSec?: number;
}

const tomlString = (s: string): string => JSON.stringify(s);
const tomlKey = (s: string): string => (/^[A-Za-z0-9_-]+$/.test(s) ? s : JSON.stringify(s));

/** The `[mcp_servers.<name>]` tables of config.toml (what `crw mcp install codex` would write). */
export function mcpServersToml(servers: Record<string, CodexMcpServer>): string {
  return Object.entries(servers)
    .map(([name, s]) => {
      const lines = [`[mcp_servers.${tomlKey(name)}]`, `command = ${tomlString(s.command)}`];
      lines.push(`args = [${(s.args ?? []).map(tomlString).join(", ")}]`);
      if (s.env) {
        const pairs = Object.entries(s.env).map(([k, v]) => `${tomlKey(k)} = ${tomlString(v)}`);
        lines.push(`env = { ${pairs.join(", ")} }`);
      }
      if (s.envVars) lines.push(`env_vars = [${s.envVars.map(tomlString).join(", ")}]`);
      if (s.cwd) lines.push(`cwd = ${tomlString(s.cwd)}`);
      if (s.required !== undefined) lines.push(`required = ${s.required}`);
      if (s.startupTimeoutSec !== undefined) lines.push(`startup_timeout_sec = ${s.startupTimeoutSec}`);
      if (s.toolTimeoutSec !== undefined) lines.push(`tool_timeout_sec = ${s.toolTimeoutSec}`);
      return `\n${lines.join("\n")}\n`;
    })
    .join("");
}

/** The `codex` executable of the pinned `@openai/codex` package. */
export function codexBin(): string {
  const require = createRequire(import.meta.url);
  return join(dirname(require.resolve("@openai/codex/package.json")), "bin", "codex.js");
}

/**
 * The native binary (the npm launcher would stand between a signal and the server on Node 20, which has
 * no process.execve), else the launcher.
 */
export function codexNativeBin(): string {
  const require = createRequire(import.meta.url);
  const triple = process.arch === "arm64" ? "aarch64-unknown-linux-musl" : "x86_64-unknown-linux-musl";
  const pkg = process.arch === "arm64" ? "@openai/codex-linux-arm64" : "@openai/codex-linux-x64";
  try {
    const root = dirname(require.resolve(`${pkg}/package.json`, { paths: [dirname(codexBin())] }));
    const native = join(root, "vendor", triple, "bin", "codex");
    if (existsSync(native)) return native;
  } catch {}
  return codexBin();
}

export function bundledCatalog(): { models: Array<Record<string, unknown>> } {
  const out = execFileSync(process.execPath, [codexBin(), "debug", "models", "--bundled"], {
    encoding: "utf8",
    env: { ...process.env, CODEX_HOME: process.env.CODEX_HOME ?? "/nonexistent-crw-codex-home" },
    stdio: ["ignore", "pipe", "ignore"],
  });
  return JSON.parse(out) as { models: Array<Record<string, unknown>> };
}

export function writeCodexHome(options: CodexHomeOptions): { configPath: string; catalogPath: string } {
  const model = options.model ?? "mock-model";
  const names = [...new Set([model, ...(options.models ?? [])])];
  mkdirSync(options.dir, { recursive: true });
  const catalog = bundledCatalog();
  const templateSlug = options.template ?? "gpt-5.5";
  const template = catalog.models.find((m) => m.slug === templateSlug);
  if (!template) throw new Error(`the bundled catalog has no ${templateSlug}`);
  const models = names.map((name, i) => ({
    ...structuredClone(template),
    slug: name,
    display_name: name,
    priority: 100 + i,
    supports_search_tool: false,
  }));
  const catalogPath = join(options.dir, "catalog.json");
  writeFileSync(catalogPath, JSON.stringify({ models }, null, 2));
  const toml = `model = ${JSON.stringify(model)}
model_provider = "mock"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
model_catalog_json = ${JSON.stringify(catalogPath)}

[model_providers.mock]
name = "Mock Responses"
base_url = ${JSON.stringify(options.baseUrl)}
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 20000

[analytics]
enabled = false

[features]
plugins = false
apps = false
remote_plugin = false
${mcpServersToml(options.mcpServers ?? {})}${options.extraToml ?? ""}
`;
  const configPath = join(options.dir, "config.toml");
  writeFileSync(configPath, toml);
  return { configPath, catalogPath };
}
