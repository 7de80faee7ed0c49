import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

/**
 * The two settings of `<CODEX_HOME>/config.toml` a run needs: agents.max_threads (default 6) and
 * features.multi_agent_v2. Read with a line scanner (the owner's per-step path loads no TOML parser):
 * `[table]` headers, `key = value` lines, comments.
 */
export interface CodexSettings {
  maxThreads: number;
  multiAgentV2: boolean;
  source: string;
}

export function readCodexSettings(env: NodeJS.ProcessEnv = process.env): CodexSettings {
  const home = env.CODEX_HOME || join(homedir(), ".codex");
  const source = join(home, "config.toml");
  const out: CodexSettings = { maxThreads: 6, multiAgentV2: false, source };
  let text: string;
  try {
    text = readFileSync(source, "utf8");
  } catch {
    return out;
  }
  let table = "";
  for (const raw of text.split("\n")) {
    const line = raw.replace(/#.*$/, "").trim();
    const h = /^\[([^\]]+)\]$/.exec(line);
    if (h?.[1]) {
      table = h[1].trim();
      continue;
    }
    const kv = /^([A-Za-z0-9_.-]+)\s*=\s*(.+)$/.exec(line);
    if (!kv?.[1] || !kv[2]) continue;
    const key = table ? `${table}.${kv[1]}` : kv[1];
    const value = kv[2].trim();
    if (key === "agents.max_threads" && /^\d+$/.test(value) && Number(value) >= 1)
      out.maxThreads = Number(value);
    if (key === "features.multi_agent_v2") out.multiAgentV2 = value === "true";
  }
  return out;
}
