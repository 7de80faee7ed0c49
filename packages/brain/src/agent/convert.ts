import type { ProviderContentPart, TranscriptMessage } from "@crw/db";
import type { AgentMessage } from "@mariozechner/pi-agent-core";
import type { Api, Message, Model, AssistantMessage as PiAssistant } from "@mariozechner/pi-ai";

/**
 * Between the journal's transcript shapes (`@crw/db`) and pi-ai's messages. An assistant message keeps its
 * text and tool calls as `content`; when the provider produced more (thinking blocks, text, thinking and
 * tool-call signatures), every part is kept in order as `providerContent`, with the producing API and
 * provider, and the next request replays exactly those parts. A custom message (a delivered result, a
 * steer) reaches the model as user text and maps back to the same journal object.
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
        content: message.providerContent
          ? message.providerContent.map((part) => ({ ...part }))
          : message.content.map((part) =>
              part.type === "text"
                ? { type: "text", text: part.text }
                : { type: "toolCall", id: part.id, name: part.name, arguments: part.arguments },
            ),
        api: (message.api as Api | undefined) ?? model.api,
        provider: message.provider ?? model.provider,
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
      const parts: ProviderContentPart[] = [];
      let extra = false;
      for (const part of m.content) {
        if (part.type === "text") {
          content.push({ type: "text", text: part.text });
          parts.push({
            type: "text",
            text: part.text,
            ...(part.textSignature !== undefined ? { textSignature: part.textSignature } : {}),
          });
          extra ||= part.textSignature !== undefined;
        } else if (part.type === "toolCall") {
          content.push({ type: "toolCall", id: part.id, name: part.name, arguments: part.arguments });
          parts.push({
            type: "toolCall",
            id: part.id,
            name: part.name,
            arguments: part.arguments,
            ...(part.thoughtSignature !== undefined ? { thoughtSignature: part.thoughtSignature } : {}),
          });
          extra ||= part.thoughtSignature !== undefined;
        } else if (part.type === "thinking") {
          parts.push({
            type: "thinking",
            thinking: part.thinking,
            ...(part.thinkingSignature !== undefined ? { thinkingSignature: part.thinkingSignature } : {}),
            ...(part.redacted !== undefined ? { redacted: part.redacted } : {}),
          });
          extra = true;
        }
      }
      return {
        role: "assistant",
        content,
        // Provider-private parts are kept (in order, with the API and provider that made them) only when
        // there are any: a plain message stays as small as it was.
        ...(extra ? { providerContent: parts, api: m.api, provider: m.provider } : {}),
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
