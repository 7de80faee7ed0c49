import { accessSync, constants, statSync } from "node:fs";
import { createRequire } from "node:module";
import { delimiter, dirname, join } from "node:path";
import { commandTransport, defaultHostCommand } from "./stdioTransport.js";
import type { HostTransport } from "./transport.js";
import { wsTransport } from "./wsTransport.js";

export class HostSpecError extends Error {
  override readonly name = "HostSpecError";
  readonly retryable = false;
}

/**
 * The host a run is configured with, as one string (run.json, `--host`, an environment variable):
 * - `ws://IP:PORT` / `wss://…`: an app-server listening on WebSocket;
 * - `unix://PATH`: an app-server's control socket (WebSocket over a Unix socket);
 * - anything else: a command line run with its stdio. `… app-server proxy …` carries WebSocket frames
 *   (the proxy pipes bytes to the control socket); any other command (`codex app-server`) JSON lines.
 *   A `lines:` or `websocket:` prefix says which explicitly;
 * - empty: the default `codex app-server proxy` (CODEX_HOME from the environment), `codex` being
 *   CRW_CODEX_BIN, else the first `codex` on PATH, else the `@openai/codex` package this install can
 *   resolve (run with this node): the run's process may be started from a login shell whose PATH lost it.
 * Words split on blanks; single or double quotes keep blanks in a word. No shell is involved.
 */
export function hostTransportFromSpec(spec: string | undefined, env?: NodeJS.ProcessEnv): HostTransport {
  const text = (spec ?? "").trim();
  if (text === "") {
    const codex = codexCommand(env ?? process.env);
    return commandTransport({
      ...defaultHostCommand,
      command: codex[0] as string,
      args: [...codex.slice(1), ...(defaultHostCommand.args ?? [])],
      env,
    });
  }
  if (/^unix:\/\//i.test(text)) {
    if (text.length <= "unix://".length) throw new HostSpecError("host socket path is empty");
    return wsTransport(text);
  }
  if (/^wss?:\/\//i.test(text)) {
    try {
      new URL(text);
    } catch {
      throw new HostSpecError(`host URL is not a URL: ${text}`);
    }
    return wsTransport(text);
  }
  const explicit = /^(lines|websocket):/.exec(text);
  const words = splitWords(explicit ? text.slice(explicit[0].length) : text);
  const [command, ...args] = words;
  if (command === undefined) throw new HostSpecError("host command is empty");
  const isProxy = args.some((word, i) => word === "app-server" && args[i + 1] === "proxy");
  const framing = (explicit?.[1] as "lines" | "websocket" | undefined) ?? (isProxy ? "websocket" : "lines");
  return commandTransport({ command, args, env, framing });
}

/** Exported for its tests. */
export function splitWords(text: string): string[] {
  const words: string[] = [];
  let word = "";
  let inWord = false;
  let quote: '"' | "'" | null = null;
  for (const ch of text) {
    if (quote) {
      if (ch === quote) quote = null;
      else word += ch;
    } else if (ch === '"' || ch === "'") {
      quote = ch;
      inWord = true;
    } else if (/\s/.test(ch)) {
      if (inWord) words.push(word);
      word = "";
      inWord = false;
    } else {
      word += ch;
      inWord = true;
    }
  }
  if (quote) throw new HostSpecError(`unterminated ${quote} in host command: ${text}`);
  if (inWord) words.push(word);
  return words;
}

/** The command words that run `codex`: CRW_CODEX_BIN, the first `codex` on PATH, the resolvable package. */
export function codexCommand(env: NodeJS.ProcessEnv): string[] {
  if (env.CRW_CODEX_BIN) return [env.CRW_CODEX_BIN];
  for (const dir of (env.PATH ?? "").split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, "codex");
    try {
      accessSync(candidate, constants.X_OK);
      if (statSync(candidate).isFile()) return [candidate];
    } catch {}
  }
  try {
    const pkg = createRequire(import.meta.url).resolve("@openai/codex/package.json");
    return [process.execPath, join(dirname(pkg), "bin", "codex.js")];
  } catch {
    return ["codex"];
  }
}
