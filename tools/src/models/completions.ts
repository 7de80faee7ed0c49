import { type ModelReply, type ReadRequest, sse, textOf } from "./request.js";

/** OpenAI Chat Completions (`POST /v1/chat/completions`), streamed as `chat.completion.chunk`s. */
type Message = { role: string; content?: unknown; tool_call_id?: string };

export const readCompletions: ReadRequest = (body) => {
  const messages = (body.messages ?? []) as Message[];
  return {
    protocol: "openai-completions",
    model: String(body.model ?? ""),
    system: messages
      .filter((m) => m.role === "system" || m.role === "developer")
      .map((m) => textOf(m.content))
      .join("\n"),
    tools: ((body.tools ?? []) as { function?: { name?: string } }[]).map((t) => t.function?.name ?? ""),
    userTexts: messages.filter((m) => m.role === "user").map((m) => textOf(m.content)),
    // Chat Completions carries no error flag on a tool message: the agent loop's text says it.
    toolResults: messages
      .filter((m) => m.role === "tool")
      .map((m) => ({ text: textOf(m.content), isError: false })),
  };
};

export function completionsStream(reply: ModelReply, n: number): string {
  const chunk = (delta: object, finish: string | null, usage?: object) => ({
    data: {
      id: `chatcmpl-${n}`,
      object: "chat.completion.chunk",
      created: 0,
      model: "loopback",
      choices: [{ index: 0, delta, finish_reason: finish }],
      ...(usage && { usage }),
    },
  });
  const usage = { prompt_tokens: 20, completion_tokens: 5, total_tokens: 25 };
  if ("text" in reply)
    return sse([
      chunk({ role: "assistant", content: reply.text }, null),
      chunk({}, "stop", usage),
      { data: "[DONE]" },
    ]);
  const call = {
    index: 0,
    id: `call_${n}`,
    type: "function",
    function: { name: reply.tool.name, arguments: JSON.stringify(reply.tool.arguments) },
  };
  return sse([
    chunk({ role: "assistant", tool_calls: [call] }, null),
    chunk({}, "tool_calls", usage),
    { data: "[DONE]" },
  ]);
}
