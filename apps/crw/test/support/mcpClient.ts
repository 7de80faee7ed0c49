import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

/** `crw mcp` under the MCP SDK's own client, for the suites that drive it as a client would. */
export const CRW_BIN = resolve(import.meta.dirname, "../../bin/crw.mjs");
const KEY = "CRW_MCP_TEST_KEY";

/** The environment that points a daemon's children at a Chat Completions model server. */
export function modelEnv(openaiBaseUrl: string, extra: Record<string, string> = {}): Record<string, string> {
  const e: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined) e[k] = v;
  return {
    ...e,
    CRW_MODEL: "openai-completions:loopback",
    CRW_MODEL_BASE_URL: openaiBaseUrl,
    CRW_MODEL_API_KEY_ENV: KEY,
    [KEY]: "secret",
    // Any free port: the files of this project run two at a time, each with daemons of its own.
    CRW_DAEMON_PORT: "0",
    ...extra,
  };
}

export interface Served {
  client: Client;
  transport: StdioClientTransport;
  stderr: () => string;
}

export async function serveMcp(options: {
  dataDir: string;
  session: string;
  cwd: string;
  env: Record<string, string>;
  args?: string[];
}): Promise<Served> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [
      CRW_BIN,
      "mcp",
      "--data-dir",
      options.dataDir,
      "--session",
      options.session,
      ...(options.args ?? []),
    ],
    cwd: options.cwd,
    env: options.env,
    stderr: "pipe",
  });
  let stderr = "";
  transport.stderr?.on("data", (d: Buffer) => {
    stderr += d.toString();
  });
  const client = new Client({ name: "crw-mcp-test", version: "1.0.0" });
  await client.connect(transport);
  return { client, transport, stderr: () => stderr };
}

export type ToolResult = {
  content: { type: string; text: string }[];
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
};

export async function callTool(
  s: Served,
  name: string,
  args: Record<string, unknown> = {},
  onprogress?: () => void,
): Promise<ToolResult> {
  return (await s.client.callTool({ name, arguments: args }, undefined, {
    timeout: 120_000,
    ...(onprogress && { onprogress }),
  })) as ToolResult;
}

export const text = (r: ToolResult) => r.content.map((c) => c.text).join("\n");

/** The children whose results a `results` call gave. */
export const resultChildren = (r: ToolResult) =>
  ((r.structuredContent?.results ?? []) as { childSessionId: string }[]).map((x) => x.childSessionId);

export const daemonPid = (dataDir: string) =>
  (JSON.parse(readFileSync(join(dataDir, "daemon.state.json"), "utf8")) as { pid: number }).pid;
