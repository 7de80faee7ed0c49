import { readFileSync } from "node:fs";
import type { CatalogConfig } from "@crw/brain";
import { MCP_TOOLS_SERVER } from "@crw/tools/mcp";
import { scratchDir } from "@crw/tools/scratch";
import type pg from "pg";
import { pino } from "pino";
import { loadConfig, ownerTokenPath, startDaemon } from "../../src/index.js";
import { TestClient } from "../support/client.js";
import { type ProviderReply, type ProviderRequest, startLoopbackProvider } from "../support/provider.js";

/**
 * A parity run on the real daemon (`startDaemon`, as a user's `crw daemon run` starts it): its MCP servers
 * (`mcp` in the daemon's configuration, bridged into every session's tools) and its tool catalog policy
 * (`tools`), forked runners by default or switched off with `runtime.subagentRunnerEnabled=false`. The
 * root session is created and prompted through the daemon's API. Sessions talk to a loopback provider
 * speaking the OpenAI Chat Completions wire protocol: every request body it receives is the provider
 * request capture.
 */
export const MCP_SERVER = MCP_TOOLS_SERVER;
export const FAKE_KEY_ENV = "CRW_PARITY_FAKE_KEY";
export const MODEL = "openai-completions:parity-model";

export type Role = "root" | "child" | "fork";
export interface Captured {
  readonly role: Role;
  readonly step: number;
  /** The request body as the provider received it (Chat Completions). */
  readonly body: {
    model?: string;
    messages?: { role: string; content?: unknown; tool_calls?: unknown[] }[];
    tools?: { type: string; function: { name: string; description: string; parameters: unknown } }[];
  };
}

type Message = { role: string; content?: unknown; tool_calls?: unknown[] };
const text = (m: Message) =>
  typeof m.content === "string"
    ? m.content
    : Array.isArray(m.content)
      ? m.content.map((p) => (p as { text?: string }).text ?? "").join("")
      : "";

/** Who asks, and how far it is: the newest user message names the session, answers since then the step. */
export function classify(body: ProviderRequest["body"]): { role: Role; step: number } {
  const messages = (body.messages ?? []) as Message[];
  let last = -1;
  for (let i = messages.length - 1; i >= 0; i--)
    if (messages[i]?.role === "user") {
      last = i;
      break;
    }
  const input = last >= 0 ? text(messages[last] as Message) : "";
  const role: Role = input.includes("FORK-TASK") ? "fork" : input.includes("CHILD-TASK") ? "child" : "root";
  return { role, step: messages.slice(last + 1).filter((m) => m.role === "assistant").length };
}

export const declaredNames = (c: Captured) => (c.body.tools ?? []).map((t) => t.function.name);

export interface ParityRun {
  readonly captured: Captured[];
  readonly placements: { runner: number; "in-process": number };
  readonly transcripts: unknown[];
  readonly reply: string;
}

export interface RunOptions {
  /** The test database (the daemon's external PostgreSQL) and a pool to read it with. */
  readonly url: string;
  readonly pool: pg.Pool;
  readonly runnerEnabled: boolean;
  /** MCP servers: name -> number of tools of the test server. */
  readonly mcp: Record<string, number>;
  /** The child forks once (Delegate with fork: true) after its MCP call. */
  readonly fork?: boolean;
  /** The daemon's `tools` section (the catalog policy); the default policy when left out. */
  readonly tools?: CatalogConfig;
}

/** The scripted model: root delegates, the child finds and calls the MCP adder (optionally forks), answers. */
function answer(calls: { role: Role; step: number }, declared: string[], fork: boolean): ProviderReply {
  const id = `call_${calls.role}_${calls.step}`;
  const direct = declared.includes("mcp__calc__add");
  if (calls.role === "root")
    return calls.step === 0
      ? {
          tool: {
            id,
            name: "Delegate",
            arguments: { task: "CHILD-TASK: add 2 and 3 with the calc tools", background: false },
          },
        }
      : { text: "root done" };
  if (calls.role === "fork") return { text: "fork done" };
  const plan: ProviderReply[] = [
    ...(direct ? [] : [{ tool: { id, name: "ToolSearch", arguments: { query: "mcp__calc__add" } } }]),
    direct
      ? { tool: { id, name: "mcp__calc__add", arguments: { a: 2, b: 3 } } }
      : { tool: { id, name: "ToolCall", arguments: { name: "mcp__calc__add", arguments: { a: 2, b: 3 } } } },
    ...(fork
      ? [
          {
            tool: {
              id,
              name: "Delegate",
              arguments: { task: "FORK-TASK: check the sum", fork: true, background: false },
            },
          },
        ]
      : []),
    { text: "child done" },
  ];
  return (plan[calls.step] ?? { text: "child done" }) as ProviderReply;
}

export async function runParitySession(options: RunOptions): Promise<ParityRun> {
  const captured: Captured[] = [];
  // The daemon and its forked runners read the provider key from this variable.
  process.env[FAKE_KEY_ENV] = "parity-key";
  const provider = await startLoopbackProvider((request: ProviderRequest) => {
    const who = classify(request.body);
    const c: Captured = { ...who, body: request.body as unknown as Captured["body"] };
    captured.push(c);
    return answer(who, declaredNames(c), options.fork === true);
  });
  const dataDir = scratchDir("crw-parity-mcp-");
  const servers = Object.fromEntries(
    Object.entries(options.mcp).map(([name, count]) => [
      name,
      { command: process.execPath, args: [MCP_SERVER, String(count)] },
    ]),
  );
  let daemon: Awaited<ReturnType<typeof startDaemon>> | undefined;
  let client: TestClient | undefined;
  try {
    daemon = await startDaemon(
      loadConfig({
        env: { DATABASE_URL: options.url },
        overrides: {
          dataDir,
          port: 0,
          runtime: { subagentRunnerEnabled: options.runnerEnabled, maxRunners: 1 },
          models: {
            default: MODEL,
            baseUrls: { "openai-completions": provider.baseUrl },
            apiKeyEnv: { "openai-completions": FAKE_KEY_ENV },
          },
          mcp: { servers },
          ...(options.tools && { tools: options.tools }),
        },
      }),
      { log: pino({ level: "silent" }) },
    );
    client = await TestClient.connect(daemon.state.url, readFileSync(ownerTokenPath(dataDir), "utf8").trim());
    const { sessionId } = await client.ok<{ sessionId: string }>("session.create", { model: MODEL });
    const outcome = await client.ok<{ stopReason: string; reply: string }>("session.send", {
      sessionId,
      text: "ROOT-GO: have a child add two numbers",
    });
    if (outcome.stopReason !== "stop") throw new Error(`root turn ended ${outcome.stopReason}`);
    await daemon.runtime.service.whenIdle();
    // The root and every session under it, in creation order.
    const sessions = (
      await options.pool.query(
        `with recursive tree(id) as (
           select id from sessions where id = $1::uuid
           union all select s.id from sessions s join tree t on s.parent_session_id = t.id)
         select s.id, s.principal_account_id::text as principal from sessions s join tree using (id)
          order by s.created_at, s.id`,
        [sessionId],
      )
    ).rows as { id: string; principal: string }[];
    const transcripts = [];
    for (const s of sessions) transcripts.push(await daemon.runtime.repo.readJournal(s.id, s.principal));
    return {
      captured,
      placements: { ...daemon.runtime.placements },
      transcripts,
      reply: outcome.reply,
    };
  } finally {
    client?.close();
    await daemon?.stop();
    await provider.close();
  }
}

/** Ids differ per run: each UUID becomes <id:N> by first appearance; timestamps are dropped. */
export function normalize(value: unknown): unknown {
  const ids = new Map<string, string>();
  const json = JSON.stringify(value, (key, v) =>
    key === "timestamp" || key === "createdAt" || key === "created_at" || key === "seq" ? undefined : v,
  );
  return JSON.parse(
    json
      .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, (m) => {
        if (!ids.has(m)) ids.set(m, `<id:${ids.size + 1}>`);
        return ids.get(m) as string;
      })
      .replace(/\(pid \d+\)/g, "(pid <pid>)"),
  );
}
