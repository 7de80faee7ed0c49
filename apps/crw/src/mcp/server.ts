import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { callTool, refusal } from "./handlers.js";
import type { DaemonLink } from "./link.js";
import { ResultInbox } from "./results.js";
import { TOOLS } from "./tools.js";

const INSTRUCTIONS = `crw runs sub-agents durably: delegate work with \`delegate\` (background for long work), keep working,
and collect answers with \`results\`: each answer is given exactly once, even across crashes and restarts.
\`status\` lists this session's sub-agents and workflows; \`land\` merges the branch of one that worked in isolation.`;

/**
 * Serves crw's tools over stdio until the client closes the connection. Stdout is the protocol: every
 * message of crw's own goes to stderr.
 */
export async function serveMcp(link: DaemonLink, version: string): Promise<void> {
  const inbox = new ResultInbox(link);
  const server = new Server(
    { name: "crw", version },
    { capabilities: { tools: {} }, instructions: INSTRUCTIONS },
  );
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS as never }));
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const token = request.params._meta?.progressToken;
    let step = 0;
    const progress = (message: string) => {
      if (token === undefined) return;
      step++;
      void extra
        .sendNotification({
          method: "notifications/progress",
          params: { progressToken: token, progress: step, message },
        })
        .catch(() => {});
    };
    try {
      return (await callTool(request.params.name, request.params.arguments, {
        link,
        inbox,
        progress,
        signal: extra.signal,
      })) as never;
    } catch (e) {
      link.options.log(
        `${request.params.name} failed: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`,
      );
      return refusal(`${request.params.name} failed: ${e instanceof Error ? e.message : String(e)}`) as never;
    }
  });
  const transport = new StdioServerTransport();
  const closed = new Promise<void>((resolve) => {
    transport.onclose = () => resolve();
    process.stdin.once("end", () => resolve());
  });
  await server.connect(transport);
  await closed;
  await server.close().catch(() => {});
}
