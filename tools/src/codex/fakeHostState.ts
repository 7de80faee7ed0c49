import { existsSync } from "node:fs";
import {
  rolloutPathFor,
  writeAgentMessage,
  writeSessionMeta,
  writeTokenCount,
  writeUserMessage,
} from "./fakeRollout.js";
import {
  addUsage,
  agentMessageItem,
  type CollabCall,
  collabAgentToolCallItem,
  type FakeUsage,
  makeThread,
  makeTurn,
  newId,
  nowSeconds,
  type Phase,
  type Thread,
  type ThreadItem,
  type ThreadStatus,
  type TokenUsageBreakdown,
  type Turn,
  userMessageItem,
  zeroUsage,
} from "./fakeShapes.js";

/**
 * The threads, turns and items a fake app-server holds, changed by the protocol's requests and by a
 * test's script, each change announced as the notifications the real server sends, in its order:
 * thread/status/changed {active}, turn/started, item/started + item/completed (userMessage),
 * item/agentMessage/delta …, item/completed (agentMessage), thread/tokenUsage/updated,
 * thread/status/changed {idle}, turn/completed.
 */

export interface FakeThread {
  thread: Thread;
  turns: Turn[];
  usage: TokenUsageBreakdown;
}

export class FakeHostError extends Error {
  override readonly name = "FakeHostError";
  constructor(
    readonly rpcCode: number,
    message: string,
  ) {
    super(message);
  }
}

export interface SpawnInput {
  ownerThreadId: string;
  message: string;
  model?: string | null;
  reasoningEffort?: string | null;
  agentRole?: string | null;
  nickname?: string | null;
  /** Defaults to the owner's turn in progress, else a completed owner turn made for the spawn. */
  ownerTurnId?: string;
}

export interface TurnEnd {
  turnId?: string;
  messages?: Array<{ text: string; phase?: Phase }>;
  /** What this turn's model responses cost; added to the thread's cumulative count. */
  usage?: FakeUsage;
}

export class FakeHostState {
  readonly threads = new Map<string, FakeThread>();

  constructor(
    readonly home: string,
    private readonly notify: (method: string, params: unknown) => void,
  ) {}

  get(threadId: string): FakeThread {
    const entry = this.threads.get(threadId);
    if (!entry) throw new FakeHostError(-32600, `thread not loaded: ${threadId}`);
    return entry;
  }

  /** The thread as thread/read answers it. */
  snapshot(threadId: string, includeTurns: boolean): Thread {
    const entry = this.get(threadId);
    return structuredClone({ ...entry.thread, turns: includeTurns ? entry.turns : [] });
  }

  createThread(init: { cwd: string; model?: string | null; reasoningEffort?: string | null }): string {
    const id = newId();
    const path = rolloutPathFor(this.home, id);
    writeSessionMeta(path, { id, cwd: init.cwd });
    const thread = makeThread({
      id,
      cwd: init.cwd,
      model: init.model ?? "mock-model",
      reasoningEffort: init.reasoningEffort ?? null,
      path,
      status: { type: "idle" },
      source: "vscode",
      threadSource: "user",
    });
    this.threads.set(id, { thread, turns: [], usage: zeroUsage() });
    this.notify("thread/started", { thread: this.snapshot(id, false) });
    return id;
  }

  /** As the owner's spawn_agent does it: no thread/started; a collabAgentToolCall on the owner's turn. */
  spawnSubagent(input: SpawnInput): { threadId: string; turnId: string } {
    const owner = this.get(input.ownerThreadId);
    const id = newId();
    const path = rolloutPathFor(this.home, id);
    const cwd = owner.thread.cwd;
    writeSessionMeta(path, { id, cwd, parentThreadId: owner.thread.id });
    const nickname = input.nickname ?? `agent-${id.slice(0, 6)}`;
    const thread = makeThread({
      id,
      cwd,
      model: input.model ?? owner.thread.model,
      reasoningEffort: input.reasoningEffort ?? owner.thread.reasoningEffort,
      path,
      status: { type: "idle" },
      parentThreadId: owner.thread.id,
      agentRole: input.agentRole ?? "default",
      agentNickname: nickname,
      source: {
        subAgent: {
          thread_spawn: {
            parent_thread_id: owner.thread.id,
            depth: 1,
            agent_path: null,
            agent_nickname: nickname,
            agent_role: input.agentRole ?? "default",
          },
        },
      },
      threadSource: "subagent",
      preview: input.message,
    });
    this.threads.set(id, { thread, turns: [], usage: zeroUsage() });
    this.recordCollab(input.ownerThreadId, input.ownerTurnId, {
      tool: "spawnAgent",
      senderThreadId: owner.thread.id,
      receiverThreadIds: [id],
      prompt: input.message,
      model: thread.model,
      reasoningEffort: thread.reasoningEffort,
    });
    const turnId = this.startTurn(id, input.message);
    return { threadId: id, turnId };
  }

  /** A collabAgentToolCall item (spawnAgent, sendInput, wait, closeAgent …) on the owner's turn. */
  recordCollab(ownerThreadId: string, ownerTurnId: string | undefined, call: CollabCall): void {
    const owner = this.get(ownerThreadId);
    let turn = ownerTurnId
      ? owner.turns.find((t) => t.id === ownerTurnId)
      : owner.turns.findLast((t) => t.status === "inProgress");
    if (!turn) {
      turn = makeTurn(newId());
      turn.status = "completed";
      turn.completedAt = nowSeconds();
      owner.turns.push(turn);
    }
    const item = collabAgentToolCallItem(call);
    turn.items.push(item);
    this.notify("item/completed", {
      item,
      threadId: ownerThreadId,
      turnId: turn.id,
      completedAtMs: Date.now(),
    });
  }

  /** A new turn with the text as its first user message (turn/start, send_input, a spawn's first turn). */
  startTurn(threadId: string, text: string): string {
    const entry = this.get(threadId);
    // As the pinned server: a turn on a thread it has not loaded (after a restart or close_agent) is refused.
    if (entry.thread.status.type === "notLoaded")
      throw new FakeHostError(-32600, `thread not found: ${threadId}`);
    if (entry.turns.some((t) => t.status === "inProgress")) {
      throw new FakeHostError(-32600, `thread ${threadId} already has a turn in progress`);
    }
    const turn = makeTurn(newId());
    entry.turns.push(turn);
    this.setStatus(threadId, { type: "active", activeFlags: [] });
    this.notify("turn/started", { threadId, turn: structuredClone(turn) });
    const item = userMessageItem(text);
    turn.items.push(item);
    writeUserMessage(entry.thread.path as string, text);
    this.notify("item/started", { item, threadId, turnId: turn.id, startedAtMs: Date.now() });
    this.notify("item/completed", { item, threadId, turnId: turn.id, completedAtMs: Date.now() });
    if (entry.thread.preview === "") entry.thread.preview = text;
    return turn.id;
  }

  turn(threadId: string, turnId?: string): Turn {
    const entry = this.get(threadId);
    const turn = turnId ? entry.turns.find((t) => t.id === turnId) : entry.turns.findLast(() => true);
    if (!turn) throw new FakeHostError(-32600, `no turn ${turnId ?? "(last)"} on thread ${threadId}`);
    return turn;
  }

  /** Agent messages (with their deltas), the token count (rollout + notification), idle, turn/completed. */
  completeTurn(threadId: string, end: TurnEnd = {}): void {
    const entry = this.get(threadId);
    const turn = this.turn(threadId, end.turnId);
    for (const message of end.messages ?? []) {
      const item = agentMessageItem(message.text, message.phase ?? null);
      this.notify("item/started", {
        item: { ...item, text: "" },
        threadId,
        turnId: turn.id,
        startedAtMs: Date.now(),
      });
      this.notify("item/agentMessage/delta", {
        threadId,
        turnId: turn.id,
        itemId: item.id,
        delta: message.text,
      });
      turn.items.push(item);
      writeAgentMessage(entry.thread.path as string, message.text, message.phase ?? null);
      this.notify("item/completed", { item, threadId, turnId: turn.id, completedAtMs: Date.now() });
    }
    this.countTokens(entry, turn, end.usage);
    this.endTurn(entry, turn, "completed", null, { type: "idle" });
  }

  failTurn(
    threadId: string,
    fail: {
      turnId?: string;
      codexErrorInfo: string | null;
      message?: string;
      usage?: FakeUsage;
      /** How the turn ends: failed (the thread reads systemError) or interrupted (idle), with the error. */
      ended?: "failed" | "interrupted";
    },
  ) {
    const entry = this.get(threadId);
    const turn = this.turn(threadId, fail.turnId);
    const error = {
      message: fail.message ?? `turn failed: ${fail.codexErrorInfo ?? "unknown"}`,
      codexErrorInfo: fail.codexErrorInfo,
      additionalDetails: null,
      misalignment: null,
    };
    this.countTokens(entry, turn, fail.usage);
    this.notify("error", { error, willRetry: false, threadId, turnId: turn.id });
    if (fail.ended === "interrupted") this.endTurn(entry, turn, "interrupted", error, { type: "idle" });
    else this.endTurn(entry, turn, "failed", error, { type: "systemError" });
  }

  interruptTurn(threadId: string, turnId?: string): void {
    const entry = this.get(threadId);
    if (entry.thread.status.type === "notLoaded")
      throw new FakeHostError(-32600, `thread not found: ${threadId}`);
    const turn = turnId ? entry.turns.find((t) => t.id === turnId) : entry.turns.findLast(() => true);
    if (turn?.status !== "inProgress") throw new FakeHostError(-32600, "no active turn to interrupt");
    this.endTurn(entry, turn, "interrupted", null, { type: "idle" });
  }

  setStatus(threadId: string, status: ThreadStatus): void {
    const entry = this.get(threadId);
    entry.thread.status = status;
    entry.thread.updatedAt = nowSeconds();
    this.notify("thread/status/changed", { threadId, status });
  }

  resume(threadId: string): Thread {
    const entry = this.get(threadId);
    if (!existsSync(entry.thread.path as string))
      throw new FakeHostError(-32600, `no rollout for ${threadId}`);
    if (entry.thread.status.type === "notLoaded") this.setStatus(threadId, { type: "idle" });
    return this.snapshot(threadId, true);
  }

  list(filter: { sourceKinds?: string[] | null; parentThreadId?: string | null }): Thread[] {
    const out: Thread[] = [];
    for (const entry of this.threads.values()) {
      const kind = sourceKind(entry.thread);
      if (filter.sourceKinds?.length && !filter.sourceKinds.includes(kind)) continue;
      if (!filter.sourceKinds?.length && kind.startsWith("subAgent")) continue; // the real default hides them
      if (filter.parentThreadId && entry.thread.parentThreadId !== filter.parentThreadId) continue;
      out.push(this.snapshot(entry.thread.id, false));
    }
    return out;
  }

  private countTokens(entry: FakeThread, turn: Turn, usage: FakeUsage | undefined): void {
    if (!usage) return;
    const last = addUsage(zeroUsage(), usage);
    entry.usage = addUsage(entry.usage, usage);
    writeTokenCount(entry.thread.path as string, entry.usage, last);
    this.notify("thread/tokenUsage/updated", {
      threadId: entry.thread.id,
      turnId: turn.id,
      tokenUsage: { total: entry.usage, last, modelContextWindow: 272000 },
    });
  }

  private endTurn(
    entry: FakeThread,
    turn: Turn,
    status: Turn["status"],
    error: Turn["error"],
    threadStatus: ThreadStatus,
  ): void {
    turn.status = status;
    turn.error = error;
    turn.completedAt = nowSeconds();
    turn.durationMs = (turn.completedAt - (turn.startedAt ?? turn.completedAt)) * 1000;
    this.setStatus(entry.thread.id, threadStatus);
    this.notify("turn/completed", { threadId: entry.thread.id, turn: structuredClone(turn) });
  }
}

function sourceKind(thread: Thread): string {
  const source = thread.source;
  if (typeof source === "string") return source;
  if ("subAgent" in source) {
    const sub = source.subAgent;
    if (typeof sub === "object" && "thread_spawn" in sub) return "subAgentThreadSpawn";
    return "subAgentOther";
  }
  return "unknown";
}

export type { ThreadItem };
