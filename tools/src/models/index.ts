import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * A model server on 127.0.0.1 that speaks two real streaming wire protocols, OpenAI Chat Completions
 * (`POST /v1/chat/completions`) and Anthropic Messages (`POST /v1/messages`), so the real provider clients
 * of the agent loop run end to end against it. `answer` sees each request, read the same way for both
 * protocols, and decides the reply: text, or one tool call.
 */
export type ModelReply = { text: string } | { tool: { name: string; arguments: Record<string, unknown> } };

export interface ModelRequest {
  readonly protocol: "openai-completions" | "anthropic-messages";
  readonly model: string;
  readonly system: string;
  /** The tools the request offers, by name. */
  readonly tools: readonly string[];
  /** The user texts, in order. */
  readonly userTexts: readonly string[];
  /** The tool results, in order: the text each tool call came back with, and whether it was an error. */
  readonly toolResults: readonly { text: string; isError: boolean }[];
}

export interface ModelServer {
  /** Base URL for `openai-completions` (ends in /v1). */
  readonly openaiBaseUrl: string;
  /** Base URL for `anthropic-messages` (the client adds /v1/messages). */
  readonly anthropicBaseUrl: string;
  readonly requests: ModelRequest[];
  close(): Promise<void>;
}

const text = (content: unknown): string => {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .map((c: { type?: string; text?: string; content?: unknown }) =>
      c.type === "text" ? (c.text ?? "") : c.type === "tool_result" ? text(c.content) : "",
    )
    .join("");
};

type Message = { role: string; content?: unknown; tool_call_id?: string };

function readOpenAi(body: Record<string, unknown>): ModelRequest {
  const messages = (body.messages ?? []) as Message[];
  return {
    protocol: "openai-completions",
    model: String(body.model ?? ""),
    system: messages
      .filter((m) => m.role === "system" || m.role === "developer")
      .map((m) => text(m.content))
      .join("\n"),
    tools: ((body.tools ?? []) as { function?: { name?: string } }[]).map((t) => t.function?.name ?? ""),
    userTexts: messages.filter((m) => m.role === "user").map((m) => text(m.content)),
    // Chat Completions carries no error flag on a tool message: the agent loop's text says it.
    toolResults: messages
      .filter((m) => m.role === "tool")
      .map((m) => ({ text: text(m.content), isError: false })),
  };
}

function readAnthropic(body: Record<string, unknown>): ModelRequest {
  const messages = (body.messages ?? []) as Message[];
  const blocks = messages.flatMap((m) => (m.role === "user" && Array.isArray(m.content) ? m.content : []));
  const system = Array.isArray(body.system) ? text(body.system) : String(body.system ?? "");
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
          : text((m.content as { type: string }[]).filter((c) => c.type === "text")),
      )
      .filter((t) => t !== ""),
    toolResults: blocks
      .filter((b: { type?: string }) => b.type === "tool_result")
      .map((b: { content?: unknown; is_error?: boolean }) => ({
        text: text(b.content),
        isError: b.is_error === true,
      })),
  };
}

const sse = (events: { event?: string; data: unknown }[]) =>
  events
    .map(
      (e) =>
        `${e.event ? `event: ${e.event}\n` : ""}data: ${typeof e.data === "string" ? e.data : JSON.stringify(e.data)}\n\n`,
    )
    .join("");

function openAiStream(reply: ModelReply, n: number): string {
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

function anthropicStream(reply: ModelReply, n: number): string {
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

export async function startModelServer(
  answer: (request: ModelRequest) => ModelReply | Promise<ModelReply>,
): Promise<ModelServer> {
  const requests: ModelRequest[] = [];
  const reply = (res: ServerResponse, status: number, body: string, type = "text/event-stream") => {
    res.writeHead(status, { "content-type": type, "cache-control": "no-cache" });
    res.end(body);
  };
  const server = createServer((req: IncomingMessage, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      let body: Record<string, unknown>;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}") as Record<string, unknown>;
      } catch {
        reply(res, 400, JSON.stringify({ error: { message: "bad JSON" } }), "application/json");
        return;
      }
      const path = req.url ?? "";
      const read = path.endsWith("/chat/completions")
        ? readOpenAi
        : path.endsWith("/messages")
          ? readAnthropic
          : undefined;
      if (!read) {
        reply(res, 404, JSON.stringify({ error: { message: `no route ${path}` } }), "application/json");
        return;
      }
      const request = read(body);
      requests.push(request);
      const n = requests.length;
      Promise.resolve(answer(request)).then(
        (r) =>
          reply(
            res,
            200,
            request.protocol === "openai-completions" ? openAiStream(r, n) : anthropicStream(r, n),
          ),
        (e: unknown) =>
          reply(res, 500, JSON.stringify({ error: { message: String(e) } }), "application/json"),
      );
    });
  });
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  const { port } = server.address() as AddressInfo;
  return {
    openaiBaseUrl: `http://127.0.0.1:${port}/v1`,
    anthropicBaseUrl: `http://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise((ok) => {
        server.close(() => ok());
        // A client's idle keep-alive connection would hold close() open.
        server.closeAllConnections();
      }),
  };
}
