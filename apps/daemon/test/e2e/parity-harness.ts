import { randomUUID } from "node:crypto";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import {
  type CatalogPolicy,
  createAgentTurnRunner,
  DEFAULT_CATALOG_POLICY,
  DelegationService,
  FileSpillStore,
  McpBridge,
  type TurnRequest,
  withToolCatalog,
} from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import {
  boundedProjectFileReader,
  delegationNodeTurns,
  JournalNodeDispatcher,
  WorkflowEngine,
  workflowTools,
} from "@crw/plugin-subagent";
import { MemoryRetryPolicySource, SubagentRunnerPool, SubagentSessionDispatch } from "@crw/subagent";
import type pg from "pg";
import { type ProviderReply, type ProviderRequest, startLoopbackProvider } from "../support/provider.js";

/**
 * The parts of the daemon's runtime a parity run needs, assembled as `apps/daemon/src/runtime.ts` does
 * (runner pool + session dispatch + delegation core + the Sub-agent plugin's tools), plus what the daemon
 * does not wire yet: MCP servers bridged into every session's tools (`McpBridge`) and the shared catalog
 * policy (`withToolCatalog`) around the placement. Sessions talk to a loopback provider speaking the
 * OpenAI Chat Completions wire protocol: every request body it receives is the provider request capture.
 */
export const MCP_SERVER = resolve(import.meta.dirname, "parity-mcp-server.mjs");
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
  readonly pool: pg.Pool;
  readonly runnerEnabled: boolean;
  /** MCP servers: name -> number of tools of the test server. */
  readonly mcp: Record<string, number>;
  /** The child forks once (Delegate with fork: true) after its MCP call. */
  readonly fork?: boolean;
  readonly policy?: CatalogPolicy;
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
  process.env[FAKE_KEY_ENV] = "parity-key";
  const provider = await startLoopbackProvider((request) => {
    const who = classify(request.body);
    const c: Captured = { ...who, body: request.body as unknown as Captured["body"] };
    captured.push(c);
    return answer(who, declaredNames(c), options.fork === true);
  });
  const catalog = {
    baseUrls: { "openai-completions": provider.baseUrl },
    apiKeyEnv: { "openai-completions": FAKE_KEY_ENV },
  } as const;
  const repo = new PgDelegationRepository(options.pool);
  const dataDir = mkdtempSync(join(tmpdir(), "crw-parity-mcp-"));
  const runnerPool = new SubagentRunnerPool({
    sizing: () => ({ maxRunners: 1, turnsPerRunner: 4 }),
    enabled: () => options.runnerEnabled,
    retryPolicySource: () =>
      new MemoryRetryPolicySource({ revision: 1, maxRetries: 1, initialDelayMs: 100, multiplier: 2 }),
    catalog: () => ({ revision: 1, public: [{ id: MODEL, provider: "openai-completions" }], accounts: {} }),
    agentOptions: () => catalog,
  });
  const placements = { runner: 0, "in-process": 0 };
  const dispatch = new SubagentSessionDispatch({
    pool: runnerPool,
    inProcess: createAgentTurnRunner(catalog),
    runnerEnabled: () => options.runnerEnabled,
    runnerKind: "agent",
    onPlaced: (_request: TurnRequest, placement) => {
      placements[placement] += 1;
    },
    placementOf: async (request) => {
      const row = await repo.getSession(request.sessionId, request.principalAccountId);
      return row.parentSessionId
        ? { channelId: row.parentSessionId, parentSessionId: row.parentSessionId }
        : { channelId: row.id };
    },
  });
  const servers = Object.fromEntries(
    Object.entries(options.mcp).map(([name, count]) => [
      name,
      { command: process.execPath, args: [MCP_SERVER, String(count)] },
    ]),
  );
  const mcp = await McpBridge.start({ servers });
  let engine!: WorkflowEngine;
  const service: DelegationService = new DelegationService({
    repo,
    runner: withToolCatalog(dispatch, options.policy ?? DEFAULT_CATALOG_POLICY),
    spill: new FileSpillStore(join(dataDir, "spill")),
    owner: `parity-${randomUUID()}`,
    tools: (session) => [
      ...workflowTools({
        service,
        engine,
        session,
        readOnly: false,
        reader: boundedProjectFileReader({ root: dataDir }),
        currentWorkDir: async () => null,
      }),
      ...mcp.tools(),
    ],
  });
  engine = new WorkflowEngine({
    pool: options.pool,
    owner: `parity-${randomUUID()}-workflows`,
    dispatcher: new JournalNodeDispatcher(repo, delegationNodeTurns(service)),
    defaultModel: MODEL,
    repo,
    onCompletion: (c) => service.resultQueued(c.parentSessionId, c.principalAccountId, c.resultId),
  });
  await service.start();
  try {
    const account = await repo.createAccount({ name: `parity-${randomUUID()}`, isOwner: true });
    const root = await service.createRootSession(account.id, MODEL);
    const outcome = await service.prompt(root.id, account.id, "ROOT-GO: have a child add two numbers");
    if (outcome.stopReason !== "stop")
      throw new Error(`root turn ended ${outcome.stopReason}: ${outcome.errorMessage}`);
    await service.whenIdle();
    const sessions = (
      await options.pool.query(
        "select id from sessions where principal_account_id = $1::uuid order by created_at, id",
        [account.id],
      )
    ).rows as { id: string }[];
    const transcripts = [];
    for (const s of sessions) transcripts.push(await repo.readJournal(s.id, account.id));
    const final = captured.filter((c) => c.role === "root").length;
    return { captured, placements, transcripts, reply: final > 0 ? "root done" : "" };
  } finally {
    await service.close().catch(() => {});
    await engine.close().catch(() => {});
    await runnerPool.close().catch(() => {});
    await mcp.close();
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
