import type { JournalEntry, TranscriptMessage } from "@crw/db";

/**
 * The model context of a session from its journal: after the latest compaction, its summary followed by
 * the rows it kept; tool intents are bookkeeping, not context. The journal itself keeps every row, so
 * delivery proofs before a compaction stay readable.
 */
export function contextFromJournal(entries: readonly JournalEntry[]): TranscriptMessage[] {
  let from = 0;
  let summary: string | undefined;
  for (const e of entries) {
    if (e.body.type === "compaction") {
      from = e.body.firstKeptSeq;
      summary = e.body.summary;
    }
  }
  const out: TranscriptMessage[] = [];
  if (summary !== undefined)
    out.push({ role: "user", content: `[summary of earlier conversation]\n${summary}` });
  for (const e of entries) {
    if (e.seq < from || e.body.type !== "message") continue;
    out.push(e.body.message);
  }
  return out;
}

/** Tool calls of the journal's assistant messages that have no toolResult after them, with their arguments. */
export function danglingToolCalls(
  entries: readonly JournalEntry[],
): Array<{ id: string; name: string; arguments?: Record<string, unknown> }> {
  const answered = new Set<string>();
  for (const e of entries)
    if (e.body.type === "message" && e.body.message.role === "toolResult")
      answered.add(e.body.message.toolCallId);
  const out: Array<{ id: string; name: string; arguments?: Record<string, unknown> }> = [];
  for (const e of entries) {
    if (e.body.type === "tool_intent" && !answered.has(e.body.toolCallId)) {
      out.push({ id: e.body.toolCallId, name: e.body.toolName, arguments: e.body.arguments });
      answered.add(e.body.toolCallId);
    }
    if (e.body.type === "message" && e.body.message.role === "assistant") {
      for (const c of e.body.message.content) {
        if (c.type === "toolCall" && !answered.has(c.id)) {
          out.push({ id: c.id, name: c.name, arguments: c.arguments });
          answered.add(c.id);
        }
      }
    }
  }
  return out;
}

/** Whether the journal ends with a finished turn: a final assistant answer with no tool calls. */
export function endsWithAnswer(entries: readonly JournalEntry[]): boolean {
  for (let i = entries.length - 1; i >= 0; i--) {
    const b = entries[i]?.body;
    if (!b || b.type === "compaction") continue;
    if (b.type !== "message") return false;
    const m = b.message;
    return m.role === "assistant" && m.stopReason === "stop" && !m.content.some((c) => c.type === "toolCall");
  }
  return false;
}

export function assistantText(message: TranscriptMessage): string {
  if (message.role !== "assistant") return "";
  return message.content.map((c) => (c.type === "text" ? c.text : "")).join("");
}
