import type { ModelReply, ModelRequest } from "./request.js";

/**
 * MCP tools as the two real agent binaries offer them to the model, and a call of one in the shape each
 * expects back:
 * - Claude Code (Anthropic Messages): a tool named `mcp__<server>__<tool>`; called by that name.
 * - Codex (Responses): a `{type:"namespace", name:"mcp__<server>", tools:[{type:"function", name:"<tool>"}]}`
 *   tool; called as a function_call with `namespace: "mcp__<server>"` and `name: "<tool>"` (Codex refuses
 *   the flat name as "unsupported call").
 * Claude Code defers MCP tools behind ToolSearch unless ENABLE_TOOL_SEARCH=false: then they are in no
 * request's `tools` and this lists none.
 */

type Tool = { type?: string; name?: string; tools?: Tool[] };

export interface McpToolRef {
  server: string;
  tool: string;
}

const PREFIX = "mcp__";

/** The MCP tools a request offers (server names as the binary spells them). */
export function mcpToolsOffered(request: ModelRequest): McpToolRef[] {
  const tools = (request.body.tools ?? []) as Tool[];
  const out: McpToolRef[] = [];
  for (const t of tools) {
    const name = t.name ?? "";
    if (!name.startsWith(PREFIX)) continue;
    if (t.type === "namespace") {
      for (const inner of t.tools ?? [])
        out.push({ server: name.slice(PREFIX.length), tool: inner.name ?? "" });
      continue;
    }
    const rest = name.slice(PREFIX.length);
    const cut = rest.indexOf("__");
    if (cut > 0) out.push({ server: rest.slice(0, cut), tool: rest.slice(cut + 2) });
  }
  return out;
}

/** A reply that calls `<server>`'s `<tool>` the way the request's protocol expects. */
export function mcpToolCall(
  request: ModelRequest,
  server: string,
  tool: string,
  args: Record<string, unknown>,
): ModelReply {
  if (request.protocol === "openai-responses")
    return { tool: { name: tool, namespace: `${PREFIX}${server}`, arguments: args } };
  return { tool: { name: `${PREFIX}${server}__${tool}`, arguments: args } };
}
