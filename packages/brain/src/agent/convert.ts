import type { TranscriptMessage } from "@crw/db";
import type { AgentMessage } from "@mariozechner/pi-agent-core";
import type { Api, Message, Model, AssistantMessage as PiAssistant } from "@mariozechner/pi-ai";

/**
 * Between the journal's transcript shapes (`@crw/db`) and pi-ai's messages. The journal keeps text and
 * tool calls; provider-private parts (thinking, signatures, images) are not journaled. A custom message
 * (a delivered result, a steer) reaches the model as user text and maps back to the same journal object.
 */
const ZERO_USAGE = {
  input: 0,
  output: 0,
  cacheRead: 0,
  cacheWrite: 0,
  totalTokens: 0,
  cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
};

export function toPiMessage(message: TranscriptMessage, model: Model<Api>): Message {
  switch (message.role) {
    case "user":
      return { role: "user", content: message.content, timestamp: 0 };
    case "custom":
      return { role: "user", content: message.content, timestamp: 0 };
    case "toolResult":
      return {
        role: "toolResult",
        toolCallId: message.toolCallId,
        toolName: message.toolName,
        content: [{ type: "text", text: message.content }],
        isError: message.isError,
        timestamp: 0,
      };
    case "assistant":
      return {
        role: "assistant",
        content: message.content.map((part) =>
          part.type === "text"
            ? { type: "text", text: part.text }
            : { type: "toolCall", id: part.id, name: part.name, arguments: part.arguments },
        ),
        api: model.api,
        provider: model.provider,
        model: message.model ?? model.id,
        usage: ZERO_USAGE,
        stopReason: message.stopReason,
        ...(message.errorMessage !== undefined ? { errorMessage: message.errorMessage } : {}),
        timestamp: 0,
      };
  }
}

function textOf(content: string | readonly { type: string; text?: string }[]): string {
  if (typeof content === "string") return content;
  return content.map((part) => (part.type === "text" ? (part.text ?? "") : `[${part.type}]`)).join("");
}

/** The journal shape of a pi message, or `undefined` for app-only messages the journal does not hold. */
export function fromPiMessage(message: AgentMessage): TranscriptMessage | undefined {
  if (!message || typeof message !== "object" || !("role" in message)) return undefined;
  switch (message.role) {
    case "user":
      return { role: "user", content: textOf(message.content) };
    case "toolResult":
      return {
        role: "toolResult",
        toolCallId: message.toolCallId,
        toolName: message.toolName,
        content: textOf(message.content),
        isError: message.isError,
      };
    case "assistant": {
      const m = message as PiAssistant;
      const content: Extract<TranscriptMessage, { role: "assistant" }>["content"] = [];
      for (const part of m.content) {
        if (part.type === "text") content.push({ type: "text", text: part.text });
        else if (part.type === "toolCall")
          content.push({ type: "toolCall", id: part.id, name: part.name, arguments: part.arguments });
      }
      return {
        role: "assistant",
        content,
        // The journal has no "length" stop: the answer ended, cut at the limit (the outcome keeps "length").
        stopReason: m.stopReason === "length" ? "stop" : m.stopReason,
        ...(m.errorMessage !== undefined ? { errorMessage: m.errorMessage } : {}),
        model: m.model,
      };
    }
    default:
      return undefined;
  }
}

export function assistantText(message: TranscriptMessage | undefined): string {
  if (message?.role !== "assistant") return "";
  return message.content.map((part) => (part.type === "text" ? part.text : "")).join("");
}
