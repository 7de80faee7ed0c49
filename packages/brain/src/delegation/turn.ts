import type {
  AssistantMessage,
  ProviderUsage,
  ResultDetails,
  ToolCallContent,
  ToolResultMessage,
  TranscriptMessage,
} from "@crw/db";
import type { DelegatedExecutionScope, DelegatedTurnIdentity } from "../scope/index.js";

/**
 * The seam through which a session's turn runs: the delegation core journals and settles, a runner (the
 * agent loop in process, a runner process of the pool, or the scripted runner of tests) produces the
 * messages. The contract, which every runner keeps:
 *  1. each assistant message is passed to `host.record` and awaited before any tool it calls runs;
 *  2. each tool call is announced with `host.beforeToolCall` and awaited before the tool runs (intent
 *     before effect), and its result is passed to `host.record`;
 *  3. after every tool round and before the next provider request, `host.drainSteering()` is awaited and
 *     the messages it returns (already journaled, FIFO) join the context;
 *  4. the outcome is returned, never thrown, for provider failures and aborts.
 */
export interface SessionTurnRunner {
  runTurn(request: TurnRequest, host: TurnHost): Promise<TurnOutcome>;
}

export interface TurnRequest {
  readonly sessionId: string;
  readonly principalAccountId: string;
  readonly model: string;
  readonly systemPrompt: string;
  /** The model context: the journal after the latest compaction, ending with this turn's input. */
  readonly context: readonly TranscriptMessage[];
  readonly tools: readonly TurnTool[];
  /** The scope this turn runs under (the read-only clamp applied); null for a root session. */
  readonly scope: DelegatedExecutionScope | null;
  readonly readOnly: boolean;
  readonly workDir: string | null;
  readonly signal: AbortSignal;
  /**
   * Who the turn acts for, re-derived from the durable rows for every turn (never stored): the principal,
   * and for a host-minted dream child of its account's own top-level conversation, the memory identity.
   * Always set by the delegation core; optional for runners' own callers.
   */
  readonly identity?: DelegatedTurnIdentity;
  /** A root session's turn (which may carry a scope: its working directory): it runs where its daemon runs. */
  readonly rootSession?: true;
  /** The session's parent (null for a root), from its row: a session's parent never changes. */
  readonly parentSessionId?: string | null;
  /**
   * An internal purpose the host minted for this turn (never a tool argument). `skill-review`: an optional
   * one-shot review turn, which a runner placement runs only opportunistically (runner-only, never queued,
   * never in the daemon). Absent for every ordinary turn.
   */
  readonly purpose?: TurnPurpose;
}

export type TurnPurpose = "skill-review";

export interface TurnHost {
  /**
   * Journals a message. An assistant message a provider produced may come with that response's usage
   * (`meta.usage`), which is recorded beside the row, never inside its JSON.
   */
  record(message: AssistantMessage | ToolResultMessage, meta?: RecordMeta): Promise<void>;
  beforeToolCall(call: ToolCallContent): Promise<void>;
  drainSteering(): Promise<TranscriptMessage[]>;
  progress(event: ProgressEvent): void;
}

export interface TurnOutcome {
  readonly stopReason: "stop" | "error" | "aborted";
  readonly errorMessage?: string;
  /**
   * A failed turn's typed condition as data: the error's class name and, when it has one, its string code
   * (a runner that could not start reports e.g. `RunnerStartupError` / `boot_timeout`). Never persisted
   * into a result payload; it lets the delegating side tell conditions apart without parsing prose.
   */
  readonly error?: TurnErrorData;
  /** The provider usage of the turn (sum over its responses); absent when no response reported usage. */
  readonly usage?: TurnUsageTotals;
}

/** What travels with a recorded message besides the message itself. */
export interface RecordMeta {
  readonly usage?: ProviderUsage;
}

/** The provider usage of a whole turn: the sum over the provider responses that reported usage. */
export interface TurnUsageTotals {
  readonly responses: number;
  readonly input: number;
  readonly output: number;
  readonly cacheRead: number;
  readonly cacheWrite: number;
  readonly totalTokens: number;
  /** Summed over the responses whose cost is known; absent when none was. */
  readonly cost?: number;
}

/** Adds one response's usage to a turn's totals (pure). */
export function addUsage(total: TurnUsageTotals | undefined, usage: ProviderUsage): TurnUsageTotals {
  const t = total ?? { responses: 0, input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0 };
  const cost = usage.cost === undefined ? t.cost : t.cost === undefined ? usage.cost : t.cost + usage.cost;
  return {
    responses: t.responses + 1,
    input: t.input + usage.input,
    output: t.output + usage.output,
    cacheRead: t.cacheRead + usage.cacheRead,
    cacheWrite: t.cacheWrite + usage.cacheWrite,
    totalTokens: t.totalTokens + usage.totalTokens,
    ...(cost === undefined ? {} : { cost }),
  };
}

export interface TurnErrorData {
  readonly name: string;
  readonly message: string;
  readonly code?: string;
}

/** The typed condition of a thrown value, as data. */
export function turnErrorData(e: unknown): TurnErrorData {
  const error = e instanceof Error ? e : new Error(String(e));
  const code = (error as { code?: unknown }).code;
  return { name: error.name, message: error.message, ...(typeof code === "string" ? { code } : {}) };
}

/** An in-memory Error for a failed outcome that keeps its typed condition (name and code). */
export function turnFailureCause(outcome: TurnOutcome, fallback: string): Error {
  const data = outcome.error;
  const cause = new Error(data?.message ?? outcome.errorMessage ?? fallback);
  if (data) {
    cause.name = data.name;
    if (data.code !== undefined) Object.assign(cause, { code: data.code });
  }
  return cause;
}

export interface ToolOutput {
  readonly content: string;
  readonly isError?: boolean;
  /** A delivered result (a foreground Delegate): the toolResult acknowledges it in its own transaction. */
  readonly details?: ResultDetails;
}

export interface ToolContext {
  readonly sessionId: string;
  readonly principalAccountId: string;
  readonly toolCallId: string;
  readonly readOnly: boolean;
  readonly workDir: string | null;
  readonly signal: AbortSignal;
  readonly progress: (event: ProgressEvent) => void;
}

export interface TurnTool {
  readonly name: string;
  readonly description: string;
  /** JSON Schema of the arguments. */
  readonly parameters: Readonly<Record<string, unknown>>;
  /** The subject the scope's argument patterns match (a path or a command line), if any. */
  subject?(args: Readonly<Record<string, unknown>>): string | undefined;
  execute(args: Readonly<Record<string, unknown>>, ctx: ToolContext): Promise<ToolOutput>;
}

/**
 * What a turn reports while it works. `session` events carry identity only; they are not activity and are
 * never forwarded into an inherited progress sink.
 */
export type ProgressEvent =
  | { readonly type: "text"; readonly sessionId: string; readonly text: string }
  | {
      readonly type: "tool";
      readonly sessionId: string;
      readonly toolName: string;
      readonly toolCallId: string;
    }
  | { readonly type: "compaction"; readonly sessionId: string }
  | { readonly type: "session"; readonly sessionId: string; readonly parentSessionId: string | null };

export type ProgressSink = (event: ProgressEvent) => void;

/** A sink that drops every event (a turn nobody watches). */
export const NO_PROGRESS: ProgressSink = () => {};
