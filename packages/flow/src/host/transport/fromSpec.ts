import { commandTransport, defaultHostCommand } from "./stdioTransport.js";
import type { HostTransport } from "./transport.js";
import { wsTransport } from "./wsTransport.js";

export class HostSpecError extends Error {
  override readonly name = "HostSpecError";
  readonly retryable = false;
}

/**
 * The host a run is configured with, as one string (run.json, `--host`, an environment variable):
 * `ws://IP:PORT` or `wss://…` for a listening app-server, otherwise a command line run with its stdio
 * (`codex app-server proxy --sock /path`); empty means the default `codex app-server proxy`. Words split
 * on blanks; single or double quotes keep blanks in a word. No shell is involved.
 */
export function hostTransportFromSpec(spec: string | undefined, env?: NodeJS.ProcessEnv): HostTransport {
  const text = (spec ?? "").trim();
  if (text === "") return commandTransport({ ...defaultHostCommand, env });
  if (/^wss?:\/\//i.test(text)) {
    try {
      new URL(text);
    } catch {
      throw new HostSpecError(`host URL is not a URL: ${text}`);
    }
    return wsTransport(text);
  }
  const words = splitWords(text);
  const [command, ...args] = words;
  if (command === undefined) throw new HostSpecError("host command is empty");
  return commandTransport({ command, args, env });
}

function splitWords(text: string): string[] {
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
