import { open } from "node:fs/promises";
import { extname, isAbsolute, resolve } from "node:path";
import { z } from "zod";
import { ClientError } from "../client/connection.js";
import type { DaemonLink } from "./link.js";
import type { ResultInbox } from "./results.js";

/** What a tool call answers: text for the model, the same facts as structured content. */
export interface ToolAnswer {
  readonly content: { type: "text"; text: string }[];
  readonly structuredContent?: Record<string, unknown>;
  readonly isError?: boolean;
}

export interface CallContext {
  readonly link: DaemonLink;
  readonly inbox: ResultInbox;
  /** Reports progress of a long call to the client (MCP progress notifications, when it asked for them). */
  readonly progress: (message: string) => void;
  readonly signal: AbortSignal;
}

const child = z.uuid({ error: "must be a child id (a UUID) that `delegate` returned" });
const workflow = z.uuid({ error: "must be a workflow id (a UUID) that `workflow_start` returned" });

const ARGS = {
  delegate: z.strictObject({
    task: z.string().min(1).max(100_000),
    cwd: z.string().min(1).max(4096).optional(),
    background: z.boolean().optional(),
    isolation: z.enum(["none", "worktree"]).optional(),
    model: z.string().min(1).max(200).optional(),
    read_only: z.boolean().optional(),
  }),
  continue: z.strictObject({
    child,
    text: z.string().min(1).max(100_000),
    background: z.boolean().optional(),
  }),
  read: z.strictObject({ child, limit: z.number().int().min(1).max(200).optional() }),
  results: z.strictObject({
    wait_seconds: z.number().min(0).max(300).optional(),
    include_taken_since: z.iso.datetime({ offset: true }).optional(),
  }),
  status: z.strictObject({}),
  workflow_start: z
    .strictObject({
      definition: z.string().min(1).optional(),
      path: z.string().min(1).max(4096).optional(),
      format: z.enum(["yaml", "json"]).optional(),
      cwd: z.string().min(1).max(4096).optional(),
    })
    .refine(
      (a) => (a.definition === undefined) !== (a.path === undefined),
      "give exactly one of definition and path",
    ),
  workflow_status: z.strictObject({ workflow }),
  workflow_cancel: z.strictObject({ workflow }),
  land: z
    .strictObject({ child: child.optional(), workflow: workflow.optional() })
    .refine(
      (a) => (a.child === undefined) !== (a.workflow === undefined),
      "give exactly one of child and workflow",
    ),
} as const;

type ToolName = keyof typeof ARGS;
type Args<N extends ToolName> = z.output<(typeof ARGS)[N]>;

/**
 * A tool's answer: the message and the facts as one JSON document, given both as structured content and as
 * its text (clients show a model the structured content when there is one, so the text repeats it whole).
 */
export const answer = (message: string, facts: Record<string, unknown> = {}): ToolAnswer => {
  const structured = { message, ...facts };
  return {
    content: [{ type: "text", text: JSON.stringify(structured, null, 2) }],
    structuredContent: structured,
  };
};

export const refusal = (text: string): ToolAnswer => ({ content: [{ type: "text", text }], isError: true });

/** Runs one tool call: arguments checked first (a typed refusal names the argument), then the daemon asked. */
export async function callTool(name: string, raw: unknown, ctx: CallContext): Promise<ToolAnswer> {
  if (!(name in ARGS)) return refusal(`crw has no tool ${JSON.stringify(name)}`);
  const parsed = ARGS[name as ToolName].safeParse(raw ?? {});
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join(".") || "arguments"}: ${i.message}`);
    return refusal(`invalid arguments for ${name}: ${issues.join("; ")}`);
  }
  try {
    return await HANDLERS[name as ToolName](parsed.data as never, ctx);
  } catch (e) {
    if (e instanceof ClientError) return refusal(`${name} failed (${e.code}): ${e.message}`);
    throw e;
  }
}

type Handler<N extends ToolName> = (args: Args<N>, ctx: CallContext) => Promise<ToolAnswer>;

const HANDLERS: { [N in ToolName]: Handler<N> } = {
  delegate: async (a, ctx) => {
    const { sessionId } = await ctx.link.session();
    const receipt = await followCall(ctx, "session.delegate", {
      sessionId,
      task: a.task,
      ...(a.background && { background: true }),
      ...(a.cwd && { cwd: a.cwd }),
      ...(a.isolation && { isolation: a.isolation }),
      ...(a.model && { model: a.model }),
      ...(a.read_only && { readOnly: true }),
    });
    return receiptAnswer(receipt, ctx);
  },
  continue: async (a, ctx) => {
    const { sessionId } = await ctx.link.session();
    const receipt = await followCall(ctx, "session.continue", {
      sessionId,
      childSessionId: a.child,
      text: a.text,
      ...(a.background && { background: true }),
    });
    return receiptAnswer(receipt, ctx);
  },
  read: async (a, ctx) => {
    const { sessionId } = await ctx.link.session();
    const r = await ctx.link.read<ReadView>("session.read", { sessionId: a.child, limit: a.limit ?? 20 });
    if (r.session.parentSessionId !== sessionId) return refusal(`${a.child} is not a child of this session`);
    const state = r.openRun ? `working (${r.openRun.status})` : "idle";
    return answer(`child ${a.child}: ${state}; latest answer: ${r.reply ?? "(none yet)"}`, {
      cwd: r.session.cwd,
      messages: r.messages,
    });
  },
  results: async (a, ctx) => {
    const taken = await ctx.inbox.take({
      waitSeconds: a.wait_seconds ?? 0,
      ...(a.include_taken_since && { includeTakenSince: a.include_taken_since }),
      signal: ctx.signal,
    });
    return answer(ctx.inbox.describe(taken), { results: taken });
  },
  status: async (_a, ctx) => {
    const { sessionId, cwd } = await ctx.link.session();
    const r = await ctx.link.read<ChildrenView>("session.children", { sessionId });
    const children = r.children.map((c) => ({ ...c, runs: whereItRuns(c.execution) }));
    const count = `${r.children.length} sub-agent(s), ${r.workflows.length} workflow(s)`;
    return answer(`session ${sessionId} in ${cwd ?? "(no directory)"}: ${count}`, {
      sessionId,
      cwd,
      children,
      workflows: r.workflows,
    });
  },
  workflow_start: async (a, ctx) => {
    const { sessionId, cwd } = await ctx.link.session();
    const path = a.path
      ? isAbsolute(a.path)
        ? a.path
        : resolve(cwd ?? ctx.link.options.cwd, a.path)
      : undefined;
    const definition = a.definition ?? (await readDefinition(path as string));
    const format = a.format ?? (path && extname(path) === ".json" ? "json" : "yaml");
    const r = await ctx.link.call<{ workflowId: string; nodes: unknown }>("workflow.start", {
      definition,
      format,
      sessionId,
      ...(a.cwd && { cwd: a.cwd }),
    });
    return answer(
      `workflow ${r.workflowId} started; its summary comes through \`results\`; see its nodes with workflow_status`,
      r,
    );
  },
  workflow_status: async (a, ctx) => {
    const r = await ctx.link.read<{ status: string; nodes: { id: string; status: string }[] }>(
      "workflow.status",
      {
        workflowId: a.workflow,
      },
    );
    return answer(`workflow ${a.workflow}: ${r.status}`, r as unknown as Record<string, unknown>);
  },
  workflow_cancel: async (a, ctx) => {
    const r = await ctx.link.call<{ status: string }>("workflow.cancel", { workflowId: a.workflow });
    return answer(`workflow ${a.workflow}: ${r.status}`, r as unknown as Record<string, unknown>);
  },
  land: async (a, ctx) => {
    const r = a.child
      ? await ctx.link.call<Record<string, unknown>>("session.land", { sessionId: a.child })
      : await ctx.link.call<Record<string, unknown>>("workflow.land", { workflowId: a.workflow });
    const landed = (a.workflow ? r.landed : r) as { branch?: string; into?: string; alreadyLanded?: boolean };
    const what = a.child ? `child ${a.child}` : `workflow ${a.workflow}`;
    return answer(
      landed.alreadyLanded
        ? `${what}: branch ${landed.branch} was already landed`
        : `${what}: branch ${landed.branch} landed into ${landed.into}`,
      r,
    );
  },
};

interface ReadView {
  session: { parentSessionId: string | null; cwd: string | null };
  openRun: { status: string } | null;
  reply: string | null;
  messages: { seq: number; role: string; text?: string; toolName?: string }[];
}

interface ChildrenView {
  children: {
    childSessionId: string;
    cwd: string | null;
    branch: string | null;
    run: { status: string; kind: string; mode: string; task: string };
    execution: { location: string; runnerId?: string | null; state?: string };
  }[];
  workflows: { workflowId: string; name: string; status: string }[];
}

type Receipt =
  | { kind: "result"; childSessionId: string; resultId: string; outcome: string; body: string }
  | { kind: "started"; childSessionId: string; runId: string; stalledMs?: number }
  | { kind: "steered"; childSessionId: string; steerId: string };

/** Why a foreground call went to the background, when its stall watchdog moved it. */
function stalledNote(stalledMs: number | undefined): string {
  return stalledMs ? `showed no progress for ${Math.round(stalledMs / 1000)} s and now ` : "";
}

function whereItRuns(e: ChildrenView["children"][number]["execution"]): string {
  if (e.location === "runner") return `in runner ${e.runnerId ?? "?"} (${e.state ?? "?"})`;
  if (e.location === "in-process") return "in the daemon";
  return "nowhere now";
}

/** A delegate/continue call with its progress relayed; a connection lost meanwhile leaves the child running. */
async function followCall(
  ctx: CallContext,
  method: string,
  params: Record<string, unknown>,
): Promise<Receipt> {
  try {
    return await ctx.link.call<Receipt>(method, params, (m, p) => {
      if (m !== "session.progress") return;
      const e = p as { type: string; sessionId: string; toolName?: string };
      if (e.type === "tool") ctx.progress(`child ${e.sessionId}: ${e.toolName}`);
      else if (e.type === "session") ctx.progress(`child ${e.sessionId} started`);
    });
  } catch (e) {
    if (e instanceof ClientError && e.code === "connection_closed")
      throw new ClientError(
        "the connection to the daemon ended during the call: if the sub-agent started (`status` lists it), it goes on and its answer comes through `results`",
        "connection_closed",
      );
    throw e;
  }
}

/** A foreground answer is taken from the inbox before it is shown, so `results` never gives it again. */
async function receiptAnswer(receipt: Receipt, ctx: CallContext): Promise<ToolAnswer> {
  if (receipt.kind === "started")
    return answer(
      `child ${receipt.childSessionId} ${stalledNote(receipt.stalledMs)}works in the background; collect its answer with \`results\` (see it with \`read\`)`,
      receipt,
    );
  if (receipt.kind === "steered")
    return answer(
      `child ${receipt.childSessionId} was busy: your text was passed into its current work; its answer comes through \`results\``,
      receipt,
    );
  const taken = await ctx.inbox.takeOne(receipt.resultId);
  if (!taken)
    return answer(`child ${receipt.childSessionId} finished; its answer was already given by \`results\``, {
      ...receipt,
      body: null,
      alreadyTaken: true,
    });
  const said = answer(
    `child ${receipt.childSessionId} ${receipt.outcome === "ok" ? "answered" : "failed"}`,
    receipt,
  );
  return receipt.outcome === "ok" ? said : { ...said, isError: true };
}

/** Larger than the daemon's definition limit, so its typed refusal is what the model sees. */
const DEFINITION_READ_LIMIT = 2 * 1024 * 1024;

async function readDefinition(path: string): Promise<string> {
  try {
    const fh = await open(path, "r");
    try {
      const { size } = await fh.stat();
      if (size > DEFINITION_READ_LIMIT)
        throw new ClientError(`${path} is ${size} bytes; a definition is at most 1 MiB`, "too_large");
      return await fh.readFile("utf8");
    } finally {
      await fh.close();
    }
  } catch (e) {
    if (e instanceof ClientError) throw e;
    throw new ClientError(`cannot read ${path}: ${(e as Error).message}`, "unreadable");
  }
}
