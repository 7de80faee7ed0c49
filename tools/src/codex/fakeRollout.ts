import { appendFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import type { TokenUsageBreakdown } from "./fakeShapes.js";

/**
 * The rollout JSONL the fake host writes per thread, in the real file's line shapes (`session_meta`,
 * `event_msg` user/agent messages and `token_count` with `info.total_token_usage`), under
 * `<home>/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl` as Codex names them.
 */
export function rolloutPathFor(home: string, threadId: string, at = new Date()): string {
  const y = String(at.getUTCFullYear());
  const m = String(at.getUTCMonth() + 1).padStart(2, "0");
  const d = String(at.getUTCDate()).padStart(2, "0");
  const time = at.toISOString().slice(0, 19).replaceAll(":", "-");
  return join(home, "sessions", y, m, d, `rollout-${time}-${threadId}.jsonl`);
}

function line(path: string, type: string, payload: unknown): void {
  mkdirSync(dirname(path), { recursive: true });
  appendFileSync(path, `${JSON.stringify({ timestamp: new Date().toISOString(), type, payload })}\n`);
}

export function writeSessionMeta(
  path: string,
  meta: { id: string; cwd: string; parentThreadId?: string },
): void {
  line(path, "session_meta", {
    id: meta.id,
    timestamp: new Date().toISOString(),
    cwd: meta.cwd,
    originator: "codex_app_server",
    cli_version: "0.171.0",
    source: meta.parentThreadId
      ? { subagent: { thread_spawn: { parent_thread_id: meta.parentThreadId, depth: 1 } } }
      : "vscode",
    model_provider: "mock",
  });
}

export function writeUserMessage(path: string, message: string): void {
  line(path, "event_msg", { type: "user_message", message, images: [], local_images: [], text_elements: [] });
}

export function writeAgentMessage(path: string, message: string, phase: string | null): void {
  line(path, "event_msg", { type: "agent_message", message, phase });
}

function usageLine(u: TokenUsageBreakdown) {
  return {
    input_tokens: u.inputTokens,
    cached_input_tokens: u.cachedInputTokens,
    output_tokens: u.outputTokens,
    reasoning_output_tokens: u.reasoningOutputTokens,
    total_tokens: u.totalTokens,
  };
}

export function writeTokenCount(path: string, total: TokenUsageBreakdown, last: TokenUsageBreakdown): void {
  line(path, "event_msg", {
    type: "token_count",
    info: {
      total_token_usage: usageLine(total),
      last_token_usage: usageLine(last),
      model_context_window: 272000,
    },
    rate_limits: null,
  });
}
