/**
 * What the model server's protocols share: the request as `answer` sees it (read the same way for every
 * protocol), the reply it gives, and the SSE framing every streaming protocol uses.
 */
export type ModelReply =
  | { text: string }
  | {
      tool: {
        name: string;
        arguments: Record<string, unknown>;
        /**
         * Responses only: the function call's `namespace`. Codex offers some tools inside a
         * `{type:"namespace"}` tool (its MCP tools as `mcp__<server>`, see mcp.ts) and runs a call of one
         * only with that namespace.
         */
        namespace?: string;
      };
    };

export type ModelProtocol = "openai-completions" | "openai-responses" | "anthropic-messages";

export interface ModelRequest {
  readonly protocol: ModelProtocol;
  readonly model: string;
  readonly system: string;
  /** The tools the request offers, by name. */
  readonly tools: readonly string[];
  /** The user texts, in order. */
  readonly userTexts: readonly string[];
  /** The tool results, in order: the text each tool call came back with, and whether it was an error. */
  readonly toolResults: readonly { text: string; isError: boolean }[];
  /**
   * The request's headers, names lower-cased (several values joined with ", "): a test reads the key the
   * client sent (`authorization` for OpenAI, `x-api-key` for Anthropic) here.
   */
  readonly headers: Readonly<Record<string, string>>;
  /** The request body as sent (its `tools` with their schemas and namespaces, its whole history). */
  readonly body: Readonly<Record<string, unknown>>;
}

/** A protocol's reading of a request body; the server adds the headers and the body. */
export type ReadRequest = (body: Record<string, unknown>) => Omit<ModelRequest, "headers" | "body">;

/** A protocol's streamed answer: the whole SSE body of the reply to the n-th request. */
export type StreamReply = (reply: ModelReply, n: number) => string;

/** The text of a message's content: a string, or the text parts of a content list (tool results included). */
export const textOf = (content: unknown): string => {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .map((c: { type?: string; text?: string; content?: unknown }) =>
      c.type === "text" || c.type === "input_text" || c.type === "output_text"
        ? (c.text ?? "")
        : c.type === "tool_result"
          ? textOf(c.content)
          : "",
    )
    .join("");
};

/** Server-sent events as the providers frame them: an optional `event:` line, one `data:` line, a blank line. */
export const sse = (events: { event?: string; data: unknown }[]): string =>
  events
    .map(
      (e) =>
        `${e.event ? `event: ${e.event}\n` : ""}data: ${typeof e.data === "string" ? e.data : JSON.stringify(e.data)}\n\n`,
    )
    .join("");
