import type { JournalEntry, TranscriptMessage } from "@crw/db";

/**
 * A session's model context as a fold of its settled journal rows through `throughSeq`: the latest
 * compaction's kept seq (0 before any) and summary, and the messages at or after that seq with their seqs.
 */
export interface FoldedContext {
  readonly throughSeq: number;
  readonly keptFrom: number;
  readonly summary: string | undefined;
  readonly seqs: readonly number[];
  readonly messages: readonly TranscriptMessage[];
}

/**
 * The fold of a whole journal: after the latest compaction, its summary followed by the rows it kept; tool
 * intents are bookkeeping, not context. The journal itself keeps every row, so delivery proofs before a
 * compaction stay readable.
 */
export function foldJournal(entries: readonly JournalEntry[]): FoldedContext {
  let keptFrom = 0;
  let summary: string | undefined;
  for (const e of entries) {
    if (e.body.type === "compaction") {
      keptFrom = e.body.firstKeptSeq;
      summary = e.body.summary;
    }
  }
  const seqs: number[] = [];
  const messages: TranscriptMessage[] = [];
  for (const e of entries) {
    if (e.seq < keptFrom || e.body.type !== "message") continue;
    seqs.push(e.seq);
    messages.push(e.body.message);
  }
  return { throughSeq: entries.at(-1)?.seq ?? 0, keptFrom, summary, seqs, messages };
}

/**
 * `folded` extended by the settled rows that follow it, in seq order; the same as folding the whole journal.
 * Undefined when a compaction among them keeps rows from before the kept seq of the one the fold holds:
 * those rows left the fold, so only a fold of the whole journal can say.
 */
export function extendFold(
  folded: FoldedContext,
  entries: readonly JournalEntry[],
): FoldedContext | undefined {
  if (entries.length === 0) return folded;
  let { keptFrom, summary } = folded;
  let seqs = [...folded.seqs];
  let messages = [...folded.messages];
  for (const e of entries) {
    if (e.body.type === "compaction") {
      if (e.body.firstKeptSeq < keptFrom) return undefined;
      keptFrom = e.body.firstKeptSeq;
      summary = e.body.summary;
      const from = seqs.findIndex((seq) => seq >= keptFrom);
      const drop = from === -1 ? seqs.length : from;
      seqs = seqs.slice(drop);
      messages = messages.slice(drop);
      continue;
    }
    if (e.seq < keptFrom || e.body.type !== "message") continue;
    seqs.push(e.seq);
    messages.push(e.body.message);
  }
  return { throughSeq: entries.at(-1)?.seq ?? folded.throughSeq, keptFrom, summary, seqs, messages };
}

/** The model context a fold stands for, as a new array the caller owns (its messages are the fold's). */
export function contextOfFold(folded: FoldedContext): TranscriptMessage[] {
  if (folded.summary === undefined) return [...folded.messages];
  const summary: TranscriptMessage = {
    role: "user",
    content: `[summary of earlier conversation]\n${folded.summary}`,
  };
  return [summary, ...folded.messages];
}

/** The model context of a session from its whole journal (see `foldJournal`). */
export function contextFromJournal(entries: readonly JournalEntry[]): TranscriptMessage[] {
  return contextOfFold(foldJournal(entries));
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
