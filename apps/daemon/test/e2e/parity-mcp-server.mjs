// A real MCP server over stdio (the official SDK's low-level server) with N tools: `add`, `echo`, then
// `probe_03`..`probe_N`. `node tools-server.mjs <N>`; `CRW_MCP_FAIL=start` exits before answering.
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

if (process.env.CRW_MCP_FAIL === "start") {
  process.stderr.write("refusing to start\n");
  process.exit(3);
}
const count = Number(process.argv[2] ?? "2");
const tools = [
  {
    name: "add",
    description: "Add two integers",
    inputSchema: {
      type: "object",
      properties: { a: { type: "integer" }, b: { type: "integer" } },
      required: ["a", "b"],
    },
  },
  {
    name: "echo",
    description: "Echo a text back",
    inputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
    annotations: { readOnlyHint: true },
  },
];
for (let i = 3; i <= count; i++) {
  const n = String(i).padStart(2, "0");
  tools.push({
    name: `probe_${n}`,
    description: `Probe number ${n}: reports its own name`,
    inputSchema: { type: "object", properties: {} },
  });
}
const server = new Server({ name: "crw-test-tools", version: "1.0.0" }, { capabilities: { tools: {} } });
server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));
server.setRequestHandler(CallToolRequestSchema, async (request) => {
  const { name, arguments: args = {} } = request.params;
  if (name === "add") {
    if (!Number.isInteger(args.a) || !Number.isInteger(args.b))
      return { content: [{ type: "text", text: "a and b must be integers" }], isError: true };
    return { content: [{ type: "text", text: `${args.a + args.b} (pid ${process.pid})` }] };
  }
  if (name === "echo") return { content: [{ type: "text", text: String(args.text) }] };
  if (name === "exit") process.exit(1);
  if (tools.some((t) => t.name === name)) return { content: [{ type: "text", text: `${name} answered` }] };
  return { content: [{ type: "text", text: `unknown tool ${name}` }], isError: true };
});
await server.connect(new StdioServerTransport());
