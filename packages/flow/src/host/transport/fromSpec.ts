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
 * - empty: the default `codex app-server proxy` (CODEX_HOME from the environment).
 * Words split on blanks; single or double quotes keep blanks in a word. No shell is involved.
 */
export function hostTransportFromSpec(spec: string | undefined, env?: NodeJS.ProcessEnv): HostTransport {
  const text = (spec ?? "").trim();
  if (text === "") return commandTransport({ ...defaultHostCommand, env });
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
