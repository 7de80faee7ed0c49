/**
 * What the flow engine needs from the host that runs the owner's subagents (the Codex app-server), in the
 * engine's words. The engine depends only on this contract; `appServerHost.ts` implements it over the
 * app-server JSON-RPC protocol. Every read answers data, never throws for a host that cannot be reached:
 * "a host that cannot be asked about judges nothing", so callers must be able to tell `unreachable` apart
 * from `unknown_thread`.
 */

export type HostThreadStatus =
  | { type: "idle" }
  | { type: "active"; activeFlags: string[] }
  | { type: "systemError" }
  | { type: "notLoaded" };

export type HostTurnStatus = "inProgress" | "completed" | "interrupted" | "failed";

export type HostItem =
  | { type: "userMessage"; id: string; text: string }
  | {
      type: "agentMessage";
      id: string;
      text: string;
      /** partial_answer: a piece of an answer, neither the answer nor commentary. */
      phase: "commentary" | "partial_answer" | "final_answer" | null;
    }
  | {
      type: "collabAgentToolCall";
      id: string;
      tool: string;
      senderThreadId: string;
      receiverThreadIds: string[];
      prompt: string | null;
      model: string | null;
      reasoningEffort: string | null;
    }
  | { type: "other"; id: string; kind: string };

export interface HostTurn {
  id: string;
  status: HostTurnStatus;
  /** For a failed (or errored interrupted) turn: the host's message and its `codexErrorInfo` kind. */
  error: { message: string; codexErrorInfo: string | null } | null;
  items: HostItem[];
}

export interface HostThread {
  id: string;
  /** The spawning thread for a subagent; null for a top-level thread. */
  parentThreadId: string | null;
  agentRole: string | null;
  agentNickname: string | null;
  model: string | null;
  reasoningEffort: string | null;
  /** The cwd the host reports (for a subagent: its parent's). Recorded only as host_cwd. */
  cwd: string | null;
  status: HostThreadStatus;
  /** The rollout file (JSONL) the host writes for the thread, when it says. */
  rolloutPath: string | null;
  turns: HostTurn[];
}

/** Token parts as the rollout's last token_count (or thread/tokenUsage/updated) reports them. */
export interface TokenCount {
  input: number;
  cached_input: number;
  output: number;
  reasoning_output: number;
  total: number;
}

export type HostFailure = {
  ok: false;
  /**
   * unreachable: the host could not be asked (judges nothing); unknown_thread: the host says it has no such
   * thread; rollout_unreadable: the thread's rollout file is named by no host answer or cannot be read (its
   * turn is left unmeasured); protocol: an answer of the wrong shape.
   */
  reason: "unreachable" | "unknown_thread" | "rollout_unreadable" | "protocol";
  message: string;
};

/** A host notification naming a thread: its method and the thread's id. */
export type ThreadEventListener = (method: string, threadId: string) => void;

export type HostResult<T> = { ok: true; value: T } | HostFailure;

export interface SessionHost {
  /** thread/read with turns. */
  readThread(threadId: string): Promise<HostResult<HostThread>>;
  /** The subagent threads the owner spawned (thread/list with the subagent source kinds), turns included. */
  listSubagents(ownerThreadId: string): Promise<HostResult<HostThread[]>>;
  /** The thread's cumulative token count from its rollout; undefined when the rollout has none yet. */
  readTokenCount(thread: HostThread): Promise<HostResult<TokenCount | undefined>>;
  /** turn/interrupt. */
  interruptTurn(threadId: string, turnId: string): Promise<HostResult<void>>;
  /** A new turn on a thread (a resume first when it is notLoaded): how the run wakes its owner. */
  startTurn(threadId: string, text: string): Promise<HostResult<{ turnId: string }>>;
  /** thread/read without turns: the thread's status alone (a host without it is read whole). */
  readStatus?(threadId: string): Promise<HostResult<HostThreadStatus>>;
  /**
   * Follows the host's notifications that name a thread (method and thread id), so a waiter can read the
   * thread again as soon as it changed instead of at its next poll. A hint only: a host may send none for
   * a thread, so every wait keeps its poll. Answers the unsubscribe.
   */
  onThreadEvent?(listener: ThreadEventListener): () => void;
  close(): Promise<void>;
}
