import { randomUUID } from "node:crypto";
import { chmod, mkdir, readFile, realpath, rename, stat, writeFile } from "node:fs/promises";
import { homedir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { type Options, out } from "../client/common.js";

const PREFIX = "crw mcp install";

/**
 * The command a client runs to start `crw mcp`, with absolute paths: clients start servers with a PATH
 * of their own (a login shell resets it), so a bare `crw` may not be found.
 */
export async function serverCommand(values: Options): Promise<{ command: string; args: string[] }> {
  const cli = await realpath(process.argv[1] as string);
  const args = [cli, "mcp"];
  if (typeof values["data-dir"] === "string") args.push("--data-dir", resolve(values["data-dir"]));
  if (typeof values.url === "string") args.push("--url", values.url);
  if (typeof values.session === "string") args.push("--session", values.session);
  if (typeof values.model === "string") args.push("--model", values.model);
  if (values["no-start"] === true) args.push("--no-start");
  return { command: process.execPath, args };
}

/** A token given at install time: the server's environment names it (the file is then kept private). */
function serverEnv(values: Options): Record<string, string> {
  return typeof values.token === "string" ? { CRW_TOKEN: values.token } : {};
}

/**
 * Variables Codex copies from its own environment into the server's (it passes only HOME, PATH and a few
 * others): where the daemon is, and the model settings and key a daemon that `crw mcp` starts runs with.
 */
function codexEnvVars(): string[] {
  const names = [
    "CRW_HOME",
    "CRW_DAEMON_DIR",
    "DATABASE_URL",
    "CRW_TOKEN",
    "CRW_MODEL",
    "CRW_MODEL_BASE_URL",
  ];
  names.push("CRW_MODEL_API_KEY_ENV");
  const keyVar = process.env.CRW_MODEL_API_KEY_ENV;
  if (keyVar && /^[A-Za-z_][A-Za-z0-9_]*$/.test(keyVar)) names.push(keyVar);
  return names;
}

export async function installFor(client: "codex" | "claude", values: Options): Promise<number> {
  const server = { ...(await serverCommand(values)), env: serverEnv(values) };
  try {
    const file =
      client === "codex" ? await installCodex(server, values) : await installClaude(server, values);
    out(`crw is configured as the MCP server "crw" in ${file}: ${server.command} ${server.args.join(" ")}`);
    return 0;
  } catch (e) {
    process.stderr.write(`${PREFIX}: ${e instanceof Error ? e.message : String(e)}\n`);
    return 1;
  }
}

interface ServerEntry {
  command: string;
  args: string[];
  env: Record<string, string>;
}

/** Replaces (or adds) the `[mcp_servers.crw]` table of Codex's config.toml; the rest stays byte for byte. */
async function installCodex(server: ServerEntry, values: Options): Promise<string> {
  const home = process.env.CODEX_HOME ?? join(homedir(), ".codex");
  const file = typeof values.config === "string" ? resolve(values.config) : join(home, "config.toml");
  const before = await readIfExists(file);
  const kept = withoutTomlTable(before ?? "", "mcp_servers.crw");
  const str = (s: string) => JSON.stringify(s);
  const lines = [
    "[mcp_servers.crw]",
    `command = ${str(server.command)}`,
    `args = [${server.args.map(str).join(", ")}]`,
    `env_vars = [${codexEnvVars().map(str).join(", ")}]`,
    // Codex does not wait for a server that is not required: one slower than a few hundred ms to list its
    // tools is left out of the turn.
    "required = true",
    "startup_timeout_sec = 30",
    // A foreground delegate lasts as long as its sub-agent works (progress does not extend the bound).
    "tool_timeout_sec = 3600",
  ];
  const env = Object.entries(server.env);
  if (env.length > 0) lines.push("", "[mcp_servers.crw.env]", ...env.map(([k, v]) => `${k} = ${str(v)}`));
  const body = `${kept.replace(/\s*$/, "")}${kept.trim() ? "\n\n" : ""}${lines.join("\n")}\n`;
  await writeAtomically(file, body, env.length > 0);
  return file;
}

/** The TOML text without the table `name` and its sub-tables (`[name]`, `[name.x]`). */
export function withoutTomlTable(text: string, name: string): string {
  const out: string[] = [];
  let skipping = false;
  for (const line of text.split("\n")) {
    const header = /^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$/.exec(line);
    if (header) {
      const table = (header[1] as string).replace(/\s+/g, "");
      skipping = table === name || table.startsWith(`${name}.`);
    }
    if (!skipping) out.push(line);
  }
  return out.join("\n");
}

/** Sets `mcpServers.crw` in Claude Code's user config (~/.claude.json) or a project's .mcp.json. */
async function installClaude(server: ServerEntry, values: Options): Promise<string> {
  const file =
    typeof values.config === "string"
      ? resolve(values.config)
      : values.project === true
        ? resolve(".mcp.json")
        : join(homedir(), ".claude.json");
  const before = await readIfExists(file);
  let doc: Record<string, unknown> = {};
  if (before?.trim()) {
    try {
      doc = JSON.parse(before) as Record<string, unknown>;
    } catch (e) {
      throw new Error(`${file} is not JSON (${(e as Error).message}); fix or move it, then run this again`);
    }
    if (typeof doc !== "object" || doc === null || Array.isArray(doc))
      throw new Error(`${file} is not a JSON object`);
  }
  const servers = (doc.mcpServers ?? {}) as Record<string, unknown>;
  doc.mcpServers = {
    ...servers,
    // timeout: a tool call's bound in ms (a foreground delegate lasts as long as its sub-agent works).
    crw: { type: "stdio", command: server.command, args: server.args, env: server.env, timeout: 3_600_000 },
  };
  await writeAtomically(file, `${JSON.stringify(doc, null, 2)}\n`, Object.keys(server.env).length > 0);
  return file;
}

async function readIfExists(file: string): Promise<string | undefined> {
  try {
    return await readFile(file, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw e;
  }
}

/**
 * Written beside and renamed over, keeping the file's mode; a file that now holds a token is made private
 * (0600) when others could read it.
 */
async function writeAtomically(file: string, body: string, secret: boolean): Promise<void> {
  await mkdir(dirname(file), { recursive: true });
  let mode = await stat(file).then(
    (s) => s.mode & 0o777,
    () => 0o600,
  );
  if (secret && (mode & 0o077) !== 0) {
    process.stderr.write(
      `${PREFIX}: ${file} now holds a token: its mode goes from ${mode.toString(8)} to 600\n`,
    );
    mode = 0o600;
  }
  const tmp = `${file}.${randomUUID()}.tmp`;
  await writeFile(tmp, body, { mode, flush: true });
  await chmod(tmp, mode); // exactly the mode, whatever the umask
  await rename(tmp, file);
}
