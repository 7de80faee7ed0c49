import type { JournalRow, NewRow, Tokens } from "../journal/rows.js";
import { addTokens, subtractTokens } from "./callFold.js";

/**
 * The run's token figure. Every row that carries a call's tokens carries the call's whole count so far
 * (completed, null_model and held `tokens`, a step's `call_tokens`), so a call is counted by its newest such
 * row, never by a sum of its rows.
 *
 * RunSpent reads the journal: each call's newest terminal row (completed, null_model, held). A process's
 * spent() is what it counted: a call's tokens are counted when the process writes a row carrying them, less
 * what the call's terminal rows already held when the process began. So tokens an earlier process measured
 * and never ended the call with (a recovered send_input turn's `call_tokens`, in no terminal row) count
 * against the run's figure when the resumed process takes them, and its terminal row carries them: RunSpent
 * and spent() count them once. A turn left unmeasured (tokens_unmeasured) adds nothing: a token ceiling
 * counts the calls the run measured.
 */
const TERMINAL = new Set(["completed", "null_model", "held"]);

function carried(row: JournalRow | NewRow): { call: string; tokens: Tokens } | null {
  const r = row as { type: string; call?: unknown; tokens?: Tokens; call_tokens?: Tokens };
  if (typeof r.call !== "string") return null;
  if (TERMINAL.has(r.type) && r.tokens) return { call: r.call, tokens: r.tokens };
  if (r.type === "step_published" && r.call_tokens) return { call: r.call, tokens: r.call_tokens };
  return null;
}

/** Each call's count as its newest terminal row records it. */
function terminalCounts(rows: readonly (JournalRow | NewRow)[]): Map<string, Tokens> {
  const out = new Map<string, Tokens>();
  for (const row of rows) {
    const c = carried(row);
    if (c && row.type !== "step_published") out.set(c.call, c.tokens);
  }
  return out;
}

/** RunSpent: the run's tokens as its journal's terminal rows record them, each call once. */
export function runSpent(rows: readonly (JournalRow | NewRow)[]): Tokens {
  let sum: Tokens = {};
  for (const t of terminalCounts(rows).values()) sum = addTokens(sum, t);
  return sum;
}

/** The total a ceiling compares: the `total` part, else input plus output. */
export function tokenTotal(t: Tokens): number {
  return t.total ?? (t.input ?? 0) + (t.output ?? 0);
}

/** A harvest's record of its subagent's whole count: the thread and the call it was harvested for. */
function threadCount(row: JournalRow | NewRow): { thread: string; call: string; tokens: Tokens } | null {
  if (row.type !== "completed" && row.type !== "null_model") return null;
  const t = row.thread_tokens;
  return t ? { thread: t.thread_id, call: row.call, tokens: t.tokens } : null;
}

export class TokenFigure {
  private readonly base: Map<string, Tokens>;
  private readonly counted = new Map<string, Tokens>();
  private readonly start: Tokens;
  /** Per subagent thread, its harvests' counts in journal order (a thread serves a call or two). */
  private readonly threads = new Map<string, { call: string; tokens: Tokens }[]>();

  constructor(rows: readonly JournalRow[]) {
    this.base = terminalCounts(rows);
    this.start = runSpent(rows);
    for (const row of rows) this.noteThread(row);
  }

  /** Called with every batch the process writes. */
  observe(rows: readonly (JournalRow | NewRow)[]): void {
    for (const row of rows) {
      const c = carried(row);
      if (c) this.counted.set(c.call, c.tokens);
      this.noteThread(row);
    }
  }

  /**
   * The thread's whole count at the newest harvest of a call other than `call`: what a subagent bound to
   * an earlier call first (a same-thread review) had counted before this call's turns.
   */
  threadCountBefore(threadId: string, call: string): Tokens | undefined {
    const list = this.threads.get(threadId) ?? [];
    for (let i = list.length - 1; i >= 0; i--) if (list[i]?.call !== call) return list[i]?.tokens;
    return undefined;
  }

  private noteThread(row: JournalRow | NewRow): void {
    const t = threadCount(row);
    if (!t) return;
    const list = this.threads.get(t.thread);
    if (list) list.push({ call: t.call, tokens: t.tokens });
    else this.threads.set(t.thread, [{ call: t.call, tokens: t.tokens }]);
  }

  /** What this process counted (the process's spent()). */
  spent(): Tokens {
    let sum: Tokens = {};
    for (const [call, t] of this.counted) sum = addTokens(sum, subtractTokens(t, this.base.get(call)));
    return sum;
  }

  /** The run's figure: RunSpent when the process began plus what it counted since. */
  run(): Tokens {
    return addTokens(this.start, this.spent());
  }
}
