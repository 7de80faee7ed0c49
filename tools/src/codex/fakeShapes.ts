import { randomUUID } from "node:crypto";
import type { AppServerProtocol as P } from "@crw/flow";

/** Builders of protocol values in the generated types' shapes, as the pinned app-server fills them. */

export type Thread = P.Thread;
export type Turn = P.Turn;
export type ThreadItem = P.ThreadItem;
export type ThreadStatus = P.ThreadStatus;
export type TokenUsageBreakdown = P.TokenUsageBreakdown;
export type SessionSource = P.SessionSource;

export function newId(): string {
  return randomUUID();
}

export function nowSeconds(): number {
  return Math.floor(Date.now() / 1000);
}

export interface ThreadInit {
  id: string;
  cwd: string;
  model: string | null;
  reasoningEffort: string | null;
  path: string;
  status: ThreadStatus;
  parentThreadId?: string;
  agentRole?: string | null;
  agentNickname?: string | null;
  source: SessionSource;
  threadSource: string | null;
  preview?: string;
}

export function makeThread(init: ThreadInit): Thread {
  const now = nowSeconds();
  return {
    id: init.id,
    environments: [{ environmentId: "local", cwd: init.cwd, runtimeWorkspaceRoots: [init.cwd] }],
    extra: null,
    sessionId: init.parentThreadId ?? init.id,
    forkedFromId: null,
    attachedToThreadId: null,
    parentThreadId: init.parentThreadId ?? null,
    preview: init.preview ?? "",
    ephemeral: false,
    section: null,
    sectionEnteredAt: null,
    projectId: null,
    historyMode: "paginated",
    modelProvider: "mock",
    model: init.model,
    reasoningEffort: init.reasoningEffort,
    createdAt: now,
    updatedAt: now,
    recencyAt: now,
    status: init.status,
    path: init.path,
    cwd: init.cwd,
    cliVersion: "0.171.0",
    originator: "codex_app_server",
    source: init.source,
    canAcceptDirectInput: true,
    threadSource: init.threadSource,
    agentNickname: init.agentNickname ?? null,
    agentRole: init.agentRole ?? null,
    gitInfo: null,
    name: null,
    daybreakEnabled: null,
    turns: [],
  } as Thread;
}

export function makeTurn(id: string): Turn {
  return {
    id,
    rootTurnId: id,
    items: [],
    itemsView: "full",
    status: "inProgress",
    error: null,
    startedAt: nowSeconds(),
    completedAt: null,
    durationMs: null,
  };
}

export function userMessageItem(text: string): ThreadItem {
  return {
    type: "userMessage",
    id: newId(),
    clientId: null,
    content: [{ type: "text", text, text_elements: [] }],
  } as ThreadItem;
}

export type Phase = "commentary" | "final_answer" | "partial_answer" | null;

export function agentMessageItem(text: string, phase: Phase): ThreadItem {
  return {
    type: "agentMessage",
    id: newId(),
    moderation: null,
    text,
    phase,
    memoryCitation: null,
    delivery: null,
    questions: null,
  } as ThreadItem;
}

export interface CollabCall {
  tool: P.CollabAgentTool;
  senderThreadId: string;
  receiverThreadIds: string[];
  prompt: string | null;
  model: string | null;
  reasoningEffort: string | null;
}

export function collabAgentToolCallItem(call: CollabCall): ThreadItem {
  const agentsStates: Record<string, P.CollabAgentState> = {};
  for (const id of call.receiverThreadIds) agentsStates[id] = { status: "running", message: null };
  return {
    type: "collabAgentToolCall",
    id: newId(),
    status: "completed",
    ...call,
    agentsStates,
  } as ThreadItem;
}

export const zeroUsage = (): TokenUsageBreakdown => ({
  totalTokens: 0,
  inputTokens: 0,
  cachedInputTokens: 0,
  cacheWriteInputTokens: 0,
  outputTokens: 0,
  reasoningOutputTokens: 0,
});

/** A turn's usage in the rollout's words (what the test scripts and the engine record). */
export interface FakeUsage {
  input: number;
  cached_input?: number;
  output: number;
  reasoning_output?: number;
  /** Defaults to input + output. */
  total?: number;
}

export function addUsage(total: TokenUsageBreakdown, usage: FakeUsage): TokenUsageBreakdown {
  return {
    totalTokens: total.totalTokens + (usage.total ?? usage.input + usage.output),
    inputTokens: total.inputTokens + usage.input,
    cachedInputTokens: total.cachedInputTokens + (usage.cached_input ?? 0),
    cacheWriteInputTokens: total.cacheWriteInputTokens,
    outputTokens: total.outputTokens + usage.output,
    reasoningOutputTokens: total.reasoningOutputTokens + (usage.reasoning_output ?? 0),
  };
}
