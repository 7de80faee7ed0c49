import type { JournalRow, RowOf, Tokens } from "../journal/rows.js";

/**
 * Where a session call stands, read from its rows alone. The run process folds a call's rows before each
 * move and the resumed process folds the same rows: so a resumed call goes on exactly as the process that
 * wrote them would have (the seed's resume table):
 *
 *   last row              position   the resumed call
 *   prepared              publish    publishes the first step (P made earlier is the call's)
 *   step_published        await_bind answers a waiting report, looks the marker up, else publishes again
 *   thread_started        adopt      adopts the subagent and writes only its turn_started
 *   turn_started          harvest    retracts the step file, reads the subagent (harvest, wait or lose)
 *   session_attempt_lost  publish    closes the old subagent and spawns the next attempt
 *   held                  publish    once its subagent runs nothing, goes on in place with a new attempt
 *                                    that says why the last stopped
 *   completed, null_model terminal
 */
export type CallPosition =
  | { kind: "terminal"; row: RowOf<"completed"> | RowOf<"null_model"> }
  | { kind: "publish"; next: NextStep }
  | { kind: "await_bind"; step: RowOf<"step_published"> }
  | { kind: "adopt"; step: RowOf<"step_published">; thread: RowOf<"thread_started"> }
  | {
      kind: "harvest";
      step: RowOf<"step_published">;
      thread: RowOf<"thread_started">;
      turn: RowOf<"turn_started">;
    };

/** The step a call publishes next. */
export interface NextStep {
  k: number;
  attempt: number;
  action: "spawn" | "send_input";
  agent_id?: string;
  note?: string;
  repair?: { answer: string; errors: string[] };
  previous_answer?: string;
  tokens_seen?: Tokens;
  call_tokens?: Tokens;
  conversation_turn: number;
  replaces_turn?: number;
  /** Subagents to close before the step is published (a lost or held attempt's). */
  close: Array<{ attempt: number; agent_id: string }>;
  /** A held call's step that was published and never bound: looked up by its marker before a new one. */
  lookupFirst?: RowOf<"step_published">;
  /** A held attempt's subagents: shown running nothing before the call goes on. */
  settle?: string[];
}

export interface CallFold {
  prepared: RowOf<"prepared"> | null;
  position: CallPosition | null;
  /** The call's bound subagents by attempt (newest last): the relay reads the pair from the newest. */
  threads: RowOf<"thread_started">[];
  /** The newest interrupt intent: it goes with the turn bound to its step and attempt, no other. */
  interrupt: RowOf<"interrupt_requested"> | null;
  steps: RowOf<"step_published">[];
  lostAttempts: number[];
}

export function callRows(rows: readonly JournalRow[], call: string): JournalRow[] {
  return rows.filter((r) => "call" in r && r.call === call);
}

export function foldCall(rows: readonly JournalRow[]): CallFold {
  const fold: CallFold = {
    prepared: null,
    position: null,
    threads: [],
    interrupt: null,
    steps: [],
    lostAttempts: [],
  };
  let step: RowOf<"step_published"> | null = null;
  let thread: RowOf<"thread_started"> | null = null;
  let stepBound = false;
  for (const row of rows) {
    switch (row.type) {
      case "prepared":
        fold.prepared = row;
        fold.position = {
          kind: "publish",
          next: { k: 1, attempt: 1, action: "spawn", conversation_turn: 1, close: [] },
        };
        step = null;
        thread = null;
        break;
      case "step_published":
        step = row;
        stepBound = false;
        fold.steps.push(row);
        if (row.action === "spawn") thread = null;
        fold.position = { kind: "await_bind", step: row };
        break;
      case "thread_started":
        thread = row;
        fold.threads.push(row);
        if (step) fold.position = { kind: "adopt", step, thread: row };
        break;
      case "turn_started": {
        // a send_input looked up after a hold names its subagent on the step, not on a current thread
        const t: RowOf<"thread_started"> | null =
          thread ?? fold.threads.find((x) => x.thread_id === step?.agent_id) ?? null;
        if (step && t) {
          thread = t;
          stepBound = true;
          fold.position = { kind: "harvest", step, thread: t, turn: row };
        }
        break;
      }
      case "interrupt_requested":
        fold.interrupt = row;
        break;
      case "session_attempt_lost": {
        fold.lostAttempts.push(row.attempt);
        const k = step?.k ?? 1;
        fold.position = {
          kind: "publish",
          next: {
            k,
            attempt: row.attempt + 1,
            action: "spawn",
            note: `The previous attempt (${row.attempt}) was cut off: ${row.reason} (thread ${row.host_status}, turn ${row.turn_status ?? "none"}).`,
            ...(step?.repair ? { repair: step.repair } : {}),
            ...(step?.call_tokens ? { call_tokens: step.call_tokens } : {}),
            conversation_turn: step?.conversation_turn ?? 1,
            replaces_turn: step?.conversation_turn ?? 1,
            close: [{ attempt: row.attempt, agent_id: row.agent_id }],
          },
        };
        thread = null;
        break;
      }
      case "held": {
        const attempt = Math.max(step?.attempt ?? 0, thread?.attempt ?? 0);
        // with no bound subagent, the closes of a step not yet published (a lost attempt's) are kept
        const pending = fold.position?.kind === "publish" ? fold.position.next.close : [];
        const close = thread ? [{ attempt: thread.attempt, agent_id: thread.thread_id }] : pending;
        fold.position = {
          kind: "publish",
          next: {
            k: step ? step.k + 1 : 1,
            attempt: attempt + 1,
            action: "spawn",
            note: `The previous attempt (${Math.max(attempt, 1)}) was stopped: ${row.reason}${row.detail ? ` (${row.detail})` : ""}.`,
            ...(step?.repair ? { repair: step.repair } : {}),
            ...(step?.call_tokens ? { call_tokens: step.call_tokens } : {}),
            conversation_turn: step?.conversation_turn ?? 1,
            ...(step ? { replaces_turn: step.conversation_turn } : {}),
            close,
            ...(thread ? { settle: [thread.thread_id] } : {}),
            ...(step && !stepBound ? { lookupFirst: step } : {}),
          },
        };
        thread = null;
        break;
      }
      case "completed":
      case "null_model":
        fold.position = { kind: "terminal", row };
        break;
      default:
        break;
    }
  }
  return fold;
}

const PARTS = ["input", "cached_input", "output", "reasoning_output", "total"] as const;

/** Adds token parts; a part that comes out 0 is left out. */
export function addTokens(a: Tokens | undefined, b: Tokens | undefined): Tokens {
  const out: Tokens = {};
  for (const p of PARTS) {
    const v = (a?.[p] ?? 0) + (b?.[p] ?? 0);
    if (v > 0) out[p] = v;
  }
  return out;
}

/** `a - b` part by part (never below 0); a part that comes out 0 is left out. */
export function subtractTokens(a: Tokens | undefined, b: Tokens | undefined): Tokens {
  const out: Tokens = {};
  for (const p of PARTS) {
    const v = Math.max(0, (a?.[p] ?? 0) - (b?.[p] ?? 0));
    if (v > 0) out[p] = v;
  }
  return out;
}
