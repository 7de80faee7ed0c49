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
  /** The agent roles configured under `[agents.<type>]` (the real host refuses any other agent_type). */
  agentTypes: string[];
  source: string;
}

/** The agent types the host knows without configuration. */
export const BUILTIN_AGENT_TYPES: readonly string[] = ["default", "explorer", "worker"];

export function readCodexSettings(env: NodeJS.ProcessEnv = process.env): CodexSettings {
  const home = env.CODEX_HOME || join(homedir(), ".codex");
  const source = join(home, "config.toml");
  const out: CodexSettings = { maxThreads: 6, multiAgentV2: false, agentTypes: [], source };
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
      const agent = /^agents\.("?)([A-Za-z0-9_-]+)\1$/.exec(table);
      if (agent?.[2] && !out.agentTypes.includes(agent[2])) out.agentTypes.push(agent[2]);
      continue;
    }
    const kv = /^([A-Za-z0-9_.-]+)\s*=\s*(.+)$/.exec(line);
    if (!kv?.[1] || !kv[2]) continue;
    const key = table ? `${table}.${kv[1]}` : kv[1];
    const inline = /^agents\.([A-Za-z0-9_-]+)(?:\.|$)/.exec(key);
    if (inline?.[1] && !["max_threads", "max_depth", "job_max_runtime_seconds"].includes(inline[1]))
      if (!out.agentTypes.includes(inline[1])) out.agentTypes.push(inline[1]);
    const value = kv[2].trim();
    if (key === "agents.max_threads" && /^\d+$/.test(value) && Number(value) >= 1)
      out.maxThreads = Number(value);
    if (key === "features.multi_agent_v2") out.multiAgentV2 = value === "true";
  }
  return out;
}
