import type { z } from "zod";
import type { HostItem, HostThread, HostTurn } from "./sessionHost.js";
import type { codexErrorInfoWire, ThreadWire, threadItemWire, turnWire } from "./wire.js";

/** thread/read's Thread (validated) in the engine's words. */
export function toHostThread(thread: ThreadWire): HostThread {
  return {
    id: thread.id,
    parentThreadId: thread.parentThreadId ?? null,
    agentRole: thread.agentRole ?? null,
    agentNickname: thread.agentNickname ?? null,
    model: thread.model ?? null,
    reasoningEffort: thread.reasoningEffort ?? null,
    cwd: thread.cwd ?? null,
    status:
      thread.status.type === "active"
        ? { type: "active", activeFlags: [...(thread.status.activeFlags as string[])] }
        : { type: thread.status.type },
    rolloutPath: thread.path ?? null,
    turns: (thread.turns ?? []).map(toHostTurn),
  };
}

function toHostTurn(turn: z.output<typeof turnWire>): HostTurn {
  return {
    id: turn.id,
    status: turn.status,
    error: turn.error
      ? { message: turn.error.message, codexErrorInfo: codexErrorKind(turn.error.codexErrorInfo) }
      : null,
    items: turn.items.map(toHostItem),
  };
}

/** `"usageLimitExceeded"` stays as it is; `{ httpConnectionFailed: {…} }` becomes its key. */
export function codexErrorKind(info: z.output<typeof codexErrorInfoWire> | null): string | null {
  if (info === null) return null;
  if (typeof info === "string") return info;
  return Object.keys(info)[0] ?? null;
}

function toHostItem(item: z.output<typeof threadItemWire>): HostItem {
  switch (item.type) {
    case "userMessage": {
      const content = item.content as Array<{ type: string; text?: string }>;
      const text = content
        .filter((part) => part.type === "text" && typeof part.text === "string")
        .map((part) => part.text)
        .join("\n");
      return { type: "userMessage", id: item.id, text };
    }
    case "agentMessage":
      return { type: "agentMessage", id: item.id, text: item.text as string, phase: toPhase(item.phase) };
    case "collabAgentToolCall":
      return {
        type: "collabAgentToolCall",
        id: item.id,
        tool: item.tool as string,
        senderThreadId: item.senderThreadId as string,
        receiverThreadIds: [...(item.receiverThreadIds as string[])],
        prompt: (item.prompt as string | null) ?? null,
        model: (item.model as string | null) ?? null,
        reasoningEffort: (item.reasoningEffort as string | null) ?? null,
      };
    default:
      return { type: "other", id: item.id, kind: item.type };
  }
}

/**
 * The protocol's MessagePhase: commentary, partial_answer (a piece of an answer: not the answer, and no
 * commentary either, so a phase-less answer after it is still the answer), final_answer. A phase this
 * crw does not know is read as commentary: never the answer.
 */
function toPhase(phase: unknown): "commentary" | "partial_answer" | "final_answer" | null {
  if (phase === "final_answer" || phase === "partial_answer" || phase === "commentary") return phase;
  if (phase === null || phase === undefined) return null;
  return "commentary";
}
