import type { Tokens } from "../journal/rows.js";

/**
 * The token parts the App Server reports per thread in thread/tokenUsage/updated notifications (the
 * thread's running total), kept for the app-server backend to record when a turn ends. The run process's
 * host feeds every notification here; only the clients that loaded a thread get its notifications, so a
 * resumed process resumes the thread it follows.
 */
const totals = new Map<string, Tokens>();

interface Breakdown {
  totalTokens?: number;
  inputTokens?: number;
  cachedInputTokens?: number;
  outputTokens?: number;
  reasoningOutputTokens?: number;
}

export function noteHostNotification(n: { method: string; params: unknown }): void {
  if (n.method !== "thread/tokenUsage/updated") return;
  const p = n.params as { threadId?: unknown; tokenUsage?: { total?: Breakdown } } | null;
  if (!p || typeof p.threadId !== "string" || !p.tokenUsage?.total) return;
  const b = p.tokenUsage.total;
  const t: Tokens = {};
  const set = (key: keyof Tokens, v: unknown) => {
    if (typeof v === "number" && Number.isInteger(v) && v > 0) t[key] = v;
  };
  set("input", b.inputTokens);
  set("cached_input", b.cachedInputTokens);
  set("output", b.outputTokens);
  set("reasoning_output", b.reasoningOutputTokens);
  set("total", b.totalTokens);
  totals.set(p.threadId, t);
}

/** The thread's total as its last thread/tokenUsage/updated said, or undefined when none came. */
export function threadTokenTotal(threadId: string): Tokens | undefined {
  return totals.get(threadId);
}
