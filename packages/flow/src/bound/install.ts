import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { isAbsolute, join, resolve } from "node:path";
import { BoundError } from "./errors.js";

/**
 * `crw flow hook install`: puts the spawn hook in a CODEX_HOME's config.toml and trusts it. Codex runs a
 * hook only once trusted: hooks/list (asked of an app-server of that CODEX_HOME) gives the hook's key and
 * currentHash, and `[hooks.state."<key>"] trusted_hash = "<hash>"` trusts that exact hook. A running
 * app-server reads the change when it restarts.
 */
export interface InstallOptions {
  codexHome: string;
  /** The hook's command line (an absolute path to the CLI: a login shell may reset PATH). */
  command: string;
  /** Asks hooks/list of an app-server of this CODEX_HOME (the caller brings the host). */
  listHooks: (codexHome: string) => Promise<HookListEntry[]>;
  timeoutSec?: number;
}

export interface HookListEntry {
  key: string;
  eventName: string;
  handlerType: string;
  command?: string;
  currentHash: string;
  trustStatus: string;
  matcher: string | null;
}

export interface InstallOutcome {
  codexHome: string;
  config: string;
  command: string;
  /** false when config.toml already had the hook. */
  added: boolean;
  key: string;
  hash: string;
  /** false when it was trusted already at that hash. */
  trusted: boolean;
  restartNeeded: boolean;
}

export function codexHomeFrom(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  const raw = flag ?? env.CODEX_HOME ?? join(homedir(), ".codex");
  return isAbsolute(raw) ? raw : resolve(raw);
}

const toml = (s: string) => JSON.stringify(s);

/** A shell word for `s` (hooks run through a shell). */
export function shellWord(s: string): string {
  return /^[A-Za-z0-9_./:=@%+-]+$/.test(s) ? s : `'${s.replaceAll("'", `'\\''`)}'`;
}

export function hookBlock(command: string, timeoutSec = 10): string {
  return [
    "",
    "[[hooks.PreToolUse]]",
    'matcher = "spawn_agent"',
    "[[hooks.PreToolUse.hooks]]",
    'type = "command"',
    `command = ${toml(command)}`,
    `timeout = ${timeoutSec}`,
    "",
  ].join("\n");
}

/** config.toml with `[hooks.state."<key>"] trusted_hash` set: the table's line replaced, or the table appended. */
export function withTrustedHash(config: string, key: string, hash: string): string {
  const header = `[hooks.state.${toml(key)}]`;
  const lines = config.split("\n");
  const at = lines.findIndex((l) => l.trim() === header);
  if (at < 0)
    return `${config.endsWith("\n") || config === "" ? config : `${config}\n`}\n${header}\ntrusted_hash = ${toml(hash)}\n`;
  for (let i = at + 1; i < lines.length && !/^\s*\[/.test(lines[i] ?? ""); i++) {
    if (/^\s*trusted_hash\s*=/.test(lines[i] ?? "")) {
      lines[i] = `trusted_hash = ${toml(hash)}`;
      return lines.join("\n");
    }
  }
  lines.splice(at + 1, 0, `trusted_hash = ${toml(hash)}`);
  return lines.join("\n");
}

export async function installHook(options: InstallOptions): Promise<InstallOutcome> {
  const config = join(options.codexHome, "config.toml");
  if (!existsSync(options.codexHome))
    throw new BoundError("unwritable", `CODEX_HOME ${options.codexHome} does not exist`);
  let text = existsSync(config) ? readFileSync(config, "utf8") : "";
  const added = !text.includes(`command = ${toml(options.command)}`);
  if (added) {
    text = `${text}${hookBlock(options.command, options.timeoutSec)}`;
    writeFileSync(config, text);
  }
  const hooks = await options.listHooks(options.codexHome);
  const hook = hooks.find(
    (h) => h.eventName === "preToolUse" && h.handlerType === "command" && h.command === options.command,
  );
  if (!hook)
    throw new BoundError(
      "unwritable",
      `hooks/list of ${options.codexHome} does not list the hook '${options.command}'`,
      {
        listed: hooks.map((h) => h.key),
      },
    );
  const trusted = hook.trustStatus !== "trusted";
  if (trusted)
    writeFileSync(config, withTrustedHash(readFileSync(config, "utf8"), hook.key, hook.currentHash));
  return {
    codexHome: options.codexHome,
    config,
    command: options.command,
    added,
    key: hook.key,
    hash: hook.currentHash,
    trusted,
    restartNeeded: added || trusted,
  };
}
