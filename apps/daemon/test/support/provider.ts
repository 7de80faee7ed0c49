import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";

/** What one request to the loopback model gets: a text answer, or a tool call. */
export type ProviderReply = ({ text: string } | { tool: { id: string; name: string; arguments: object } }) & {
  /** The wire usage of the reply (Chat Completions `usage`); 7 prompt + 2 completion tokens when absent. */
  usage?: {
    prompt_tokens: number;
    completion_tokens: number;
    total_tokens: number;
    prompt_tokens_details?: { cached_tokens?: number };
  };
};

export interface ProviderRequest {
  readonly path: string;
  readonly authorization: string | undefined;
  readonly body: {
    model?: string;
    messages?: { role: string; content?: unknown }[];
    tools?: { function?: { name?: string } }[];
  };
}

export interface LoopbackProvider {
  /** `http://127.0.0.1:<port>/v1`: what `models.baseUrls["openai-completions"]` points at. */
  readonly baseUrl: string;
  readonly requests: ProviderRequest[];
  close(): Promise<void>;
}

const chunk = (delta: object, finish: string | null, usage?: object) =>
  `data: ${JSON.stringify({
    id: "chatcmpl-loopback",
    object: "chat.completion.chunk",
    created: 0,
    model: "loopback",
    choices: [{ index: 0, delta, finish_reason: finish }],
    ...(usage && { usage }),
  })}\n\n`;

function stream(reply: ProviderReply): string {
  const usage = reply.usage ?? { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 };
  if ("text" in reply)
    return `${chunk({ role: "assistant", content: reply.text }, null) + chunk({}, "stop", usage)}data: [DONE]\n\n`;
  const call = {
    index: 0,
    id: reply.tool.id,
    type: "function",
    function: { name: reply.tool.name, arguments: JSON.stringify(reply.tool.arguments) },
  };
  return (
    chunk({ role: "assistant", tool_calls: [call] }, null) +
    chunk({}, "tool_calls", usage) +
    "data: [DONE]\n\n"
  );
}

/**
 * A model provider on loopback speaking the OpenAI Chat Completions streaming wire protocol (server-sent
 * events), so the real provider client of the agent loop runs against it. `answer` decides each reply and
 * may hold a request open (await a gate) to keep a turn in flight.
 */
export async function startLoopbackProvider(
  answer: (request: ProviderRequest) => ProviderReply | Promise<ProviderReply>,
): Promise<LoopbackProvider> {
  const requests: ProviderRequest[] = [];
  const server = createServer((req: IncomingMessage, res) => {
    let raw = "";
    req.on("data", (d) => {
      raw += d.toString();
    });
    req.on("end", () => {
      const request: ProviderRequest = {
        path: req.url ?? "",
        authorization: req.headers.authorization,
        body: raw ? JSON.parse(raw) : {},
      };
      requests.push(request);
      Promise.resolve(answer(request)).then(
        (reply) => {
          res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
          res.end(stream(reply));
        },
        (e: unknown) => {
          res.writeHead(500, { "content-type": "application/json" });
          res.end(JSON.stringify({ error: { message: String(e) } }));
        },
      );
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  return {
    baseUrl: `http://127.0.0.1:${port}/v1`,
    requests,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/** The text of the newest user message of a chat request. */
export function lastUserText(request: ProviderRequest): string {
  const users = (request.body.messages ?? []).filter((m) => m.role === "user");
  const content = users[users.length - 1]?.content;
  if (typeof content === "string") return content;
  if (Array.isArray(content))
    return content.map((p) => (typeof p === "object" && p && "text" in p ? String(p.text) : "")).join("");
  return "";
}

/** The text of every user message of a chat request, joined (a continuation adds its own after the task). */
export function allUserText(request: ProviderRequest): string {
  return (request.body.messages ?? [])
    .filter((m) => m.role === "user")
    .map((m) =>
      typeof m.content === "string"
        ? m.content
        : Array.isArray(m.content)
          ? m.content.map((p) => (typeof p === "object" && p && "text" in p ? String(p.text) : "")).join("")
          : "",
    )
    .join("\n");
}

/** A gate a reply can wait on; `open()` lets every waiter through. */
export function gate(): { wait: Promise<void>; open: () => void } {
  let open = () => {};
  const wait = new Promise<void>((r) => {
    open = r;
  });
  return { wait, open };
}
