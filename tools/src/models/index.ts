import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { completionsStream, readCompletions } from "./completions.js";
import { messagesStream, messagesWhole, readMessages } from "./messages.js";
import type { ModelReply, ModelRequest, ReadRequest, StreamReply } from "./request.js";
import { readResponses, responsesStream } from "./responses.js";

export { type McpToolRef, mcpToolCall, mcpToolsOffered } from "./mcp.js";
export type { ModelProtocol, ModelReply, ModelRequest } from "./request.js";

/**
 * A model server on 127.0.0.1 that speaks three real streaming wire protocols, OpenAI Chat Completions
 * (`POST /v1/chat/completions`), OpenAI Responses (`POST /v1/responses`) and Anthropic Messages
 * (`POST /v1/messages`), so the real provider clients of the agent loop run end to end against it.
 * `answer` sees each request, read the same way for every protocol, and decides the reply: text, or one
 * tool call.
 */
export interface ModelServer {
  /** Base URL for `openai-completions` and `openai-responses` (ends in /v1). */
  readonly openaiBaseUrl: string;
  /** Base URL for `anthropic-messages` (the client adds /v1/messages). */
  readonly anthropicBaseUrl: string;
  readonly requests: ModelRequest[];
  close(): Promise<void>;
}

/** The routes, by the end of the request path. */
const ROUTES: readonly {
  suffix: string;
  read: ReadRequest;
  stream: StreamReply;
  whole?: (reply: ModelReply, n: number) => unknown;
}[] = [
  { suffix: "/chat/completions", read: readCompletions, stream: completionsStream },
  { suffix: "/responses", read: readResponses, stream: responsesStream },
  { suffix: "/messages", read: readMessages, stream: messagesStream, whole: messagesWhole },
];

/** `/v1/messages/count_tokens`: about four characters a token, as a rough tokenizer would say. */
function countTokens(body: Record<string, unknown>): { input_tokens: number } {
  return { input_tokens: Math.max(1, Math.ceil(JSON.stringify(body).length / 4)) };
}

function headersOf(req: IncomingMessage): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(req.headers)) {
    if (value !== undefined) out[name] = Array.isArray(value) ? value.join(", ") : value;
  }
  return out;
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
      // the query string is no part of the route (Azure-style clients add `?api-version=`, Claude Code
      // `?beta=true`)
      const path = (req.url ?? "").split("?")[0] ?? "";
      if (path.endsWith("/messages/count_tokens")) {
        // Claude Code may count tokens before a request; a rough count is enough, and no model turn.
        reply(res, 200, JSON.stringify(countTokens(body)), "application/json");
        return;
      }
      const route = ROUTES.find((r) => path.endsWith(r.suffix));
      if (!route) {
        reply(res, 404, JSON.stringify({ error: { message: `no route ${path}` } }), "application/json");
        return;
      }
      const request: ModelRequest = { ...route.read(body), headers: headersOf(req), body };
      requests.push(request);
      const n = requests.length;
      Promise.resolve(answer(request)).then(
        (r) =>
          // A client that asked for no stream (Anthropic `stream: false`) reads one JSON message.
          body.stream === false && route.whole
            ? reply(res, 200, JSON.stringify(route.whole(r, n)), "application/json")
            : reply(res, 200, route.stream(r, n)),
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
