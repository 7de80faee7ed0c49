import { type ModelReply, type ReadRequest, sse, textOf } from "./request.js";

/** Anthropic Messages (`POST /v1/messages`), streamed as message_start … message_stop. */
type Message = { role: string; content?: unknown };

export const readMessages: ReadRequest = (body) => {
  const messages = (body.messages ?? []) as Message[];
  const blocks = messages.flatMap((m) => (m.role === "user" && Array.isArray(m.content) ? m.content : []));
  const system = Array.isArray(body.system) ? textOf(body.system) : String(body.system ?? "");
  return {
    protocol: "anthropic-messages",
    model: String(body.model ?? ""),
    system,
    tools: ((body.tools ?? []) as { name?: string }[]).map((t) => t.name ?? ""),
    userTexts: messages
      .filter((m) => m.role === "user")
      .map((m) =>
        typeof m.content === "string"
          ? m.content
          : textOf((m.content as { type: string }[]).filter((c) => c.type === "text")),
      )
      .filter((t) => t !== ""),
    toolResults: blocks
      .filter((b: { type?: string }) => b.type === "tool_result")
      .map((b: { content?: unknown; is_error?: boolean }) => ({
        text: textOf(b.content),
        isError: b.is_error === true,
      })),
  };
};

export function messagesStream(reply: ModelReply, n: number): string {
  const start = {
    event: "message_start",
    data: {
      type: "message_start",
      message: {
        id: `msg_${n}`,
        type: "message",
        role: "assistant",
        model: "loopback",
        content: [],
        stop_reason: null,
        usage: { input_tokens: 20, output_tokens: 1 },
      },
    },
  };
  const block =
    "text" in reply
      ? [
          {
            event: "content_block_start",
            data: { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } },
          },
          {
            event: "content_block_delta",
            data: { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: reply.text } },
          },
        ]
      : [
          {
            event: "content_block_start",
            data: {
              type: "content_block_start",
              index: 0,
              content_block: { type: "tool_use", id: `toolu_${n}`, name: reply.tool.name, input: {} },
            },
          },
          {
            event: "content_block_delta",
            data: {
              type: "content_block_delta",
              index: 0,
              delta: { type: "input_json_delta", partial_json: JSON.stringify(reply.tool.arguments) },
            },
          },
        ];
  const stop = "text" in reply ? "end_turn" : "tool_use";
  return sse([
    start,
    ...block,
    { event: "content_block_stop", data: { type: "content_block_stop", index: 0 } },
    {
      event: "message_delta",
      data: {
        type: "message_delta",
        delta: { stop_reason: stop, stop_sequence: null },
        usage: { output_tokens: 5 },
      },
    },
    { event: "message_stop", data: { type: "message_stop" } },
  ]);
}

/** The reply as one message, for a request with `stream: false`. */
export function messagesWhole(reply: ModelReply, n: number): Record<string, unknown> {
  const content =
    "text" in reply
      ? [{ type: "text", text: reply.text }]
      : [{ type: "tool_use", id: `toolu_${n}`, name: reply.tool.name, input: reply.tool.arguments }];
  return {
    id: `msg_${n}`,
    type: "message",
    role: "assistant",
    model: "loopback",
    content,
    stop_reason: "text" in reply ? "end_turn" : "tool_use",
    stop_sequence: null,
    usage: { input_tokens: 20, output_tokens: 5 },
  };
}
