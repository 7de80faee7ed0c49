import {
  type DelegationService,
  delegationTools,
  type MutatingTool,
  SPILL_READ_PAGE,
  type ToolOutput,
  textPage,
} from "@crw/brain";
import type { SessionRow } from "@crw/db";
import { z } from "zod";
import type { ProjectFileReader } from "../definition/reader.js";
import { WorkflowNodeSchema } from "../definition/schema.js";
import { hostAccessors, type WorkflowHostAccessors } from "../engine/context.js";
import type { WorkflowEngine } from "../engine/engine.js";
import { WorkflowStateError } from "../errors.js";

const startArgs = z.strictObject({
  path: z.string().min(1).max(4096),
  /** Wait for the summary as this call's result (Ctrl+B moves it to the background). */
  foreground: z.boolean().default(false),
});
const addArgs = z.strictObject({ nodes: z.array(WorkflowNodeSchema).min(1).max(100) });
const workflowArgs = z.strictObject({ workflowId: z.uuid() });
const readArgs = z.strictObject({
  path: z.string().min(1).max(4096),
  offset: z.number().int().nonnegative().optional(),
  limit: z.number().int().positive().max(SPILL_READ_PAGE).optional(),
});

// Each tool's JSON Schema is made once, on first use: every turn of every session offers these tools.
const jsonSchemas = new Map<z.ZodType, Record<string, unknown>>();
function parametersOf(schema: z.ZodType): Record<string, unknown> {
  let json = jsonSchemas.get(schema);
  if (!json) {
    json = z.toJSONSchema(schema, { io: "input" }) as Record<string, unknown>;
    jsonSchemas.set(schema, json);
  }
  return json;
}

function parse<T>(schema: z.ZodType<T>, args: unknown, tool: string): T {
  const parsed = schema.safeParse(args);
  if (!parsed.success) {
    throw new WorkflowStateError(
      "not_running",
      `${tool}: ${parsed.error.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ")}`,
    );
  }
  return parsed.data;
}

const BACKGROUND =
  "The nodes run in the background; one summary of the whole workflow arrives as a message when it ends. " +
  "Keep doing independent work and end your turn when none remains.";

export interface SubagentToolsOptions {
  readonly service: DelegationService;
  readonly engine: WorkflowEngine;
  readonly session: SessionRow;
  readonly readOnly: boolean;
  /** The target-authorized, bounded, version-pinned project-file reader of this session (null: none). */
  readonly reader: ProjectFileReader | null;
  readonly currentWorkDir: () => Promise<string | null>;
  /** delegatedWorkflowExpansionAvailable: whether a node's child may call WorkflowAddNodes. */
  readonly expansionAvailable?: boolean;
  /** The host's live accessors; by default the delegation core's inbox wake is the completion sink. */
  readonly accessors?: WorkflowHostAccessors;
}

/**
 * The Sub-agent plugin's tools for one session's turn: Delegate, DelegateContinue and DelegateRead (the
 * delegation core's), and WorkflowStart, WorkflowAddNodes (only inside a running node), WorkflowResume and
 * WorkflowCancel. Errors are typed and reach the model as the tool's error result.
 */
export function subagentTools(options: SubagentToolsOptions): MutatingTool[] {
  return [...delegationTools(options.service, options.session, options.readOnly), ...workflowTools(options)];
}

/** The workflow tools alone (for a host whose delegation core already supplies Delegate and friends). */
export function workflowTools(options: SubagentToolsOptions): MutatingTool[] {
  const { engine, session, service } = options;
  const principal = session.principalAccountId;
  const ctxFor = (toolCallId: string) => ({
    parentSessionId: session.id,
    principalAccountId: principal,
    toolCallId,
    currentAccess: () => service.authorityFor(session),
    currentWorkDir: options.currentWorkDir,
    ...(options.accessors ??
      hostAccessors({
        completion: (c) => service.workflowSummaryQueued(c.parentSessionId, c.principalAccountId, c.resultId),
        writer: (summary, outcome, workflowId) =>
          service.prepareWorkflowSummary(
            { sessionId: session.id, principalAccountId: principal },
            workflowId,
            summary,
            outcome,
          ),
      })),
  });
  const tools: MutatingTool[] = [];
  tools.push(
    {
      name: "WorkflowStart",
      description:
        "Start a workflow from a definition file of this project (YAML or JSON: nodes with id, task, dependsOn, agentType or role, model, cwd, tools, outputSchema).",
      parameters: parametersOf(startArgs),
      mutates: true,
      async execute(raw, ctx): Promise<ToolOutput> {
        const a = parse(startArgs, raw, "WorkflowStart");
        if (!options.reader) {
          throw new WorkflowStateError(
            "expansion_unavailable",
            "this session has no project to read a definition from",
          );
        }
        const started = await engine.start(ctxFor(ctx.toolCallId), { path: a.path, reader: options.reader });
        const run = engine.run(started.workflowId);
        if (a.foreground && started.created && run) {
          run.attachForeground();
          const outcome = await Promise.race([run.finished, run.released.then(() => null)]);
          if (outcome?.status && outcome.resultId) {
            const body = outcome.summary ?? "";
            return {
              content: body,
              isError: outcome.status !== "completed",
              details: {
                resultId: outcome.resultId,
                outcome: outcome.status === "completed" ? "ok" : "error",
              },
            };
          }
          return { content: `Workflow ${started.workflowId} moved to the background. ${BACKGROUND}` };
        }
        return {
          content: `Workflow ${started.workflowId} ${started.created ? "started" : "was already started by this call"} with nodes ${started.nodes.join(", ")}. ${BACKGROUND}`,
        };
      },
    },
    {
      name: "WorkflowResume",
      description: "Resume a failed or cancelled workflow of this session under your current access.",
      parameters: parametersOf(workflowArgs),
      mutates: true,
      async execute(raw, ctx): Promise<ToolOutput> {
        const a = parse(workflowArgs, raw, "WorkflowResume");
        const resumed = await engine.resume(ctxFor(ctx.toolCallId), a.workflowId);
        return { content: `Workflow ${resumed.workflowId} resumed. ${BACKGROUND}` };
      },
    },
    {
      name: "WorkflowCancel",
      description:
        "Stop a running workflow of this session: running nodes are interrupted, pending ones never start.",
      parameters: parametersOf(workflowArgs),
      async execute(raw): Promise<ToolOutput> {
        const a = parse(workflowArgs, raw, "WorkflowCancel");
        const row = await engine.store.getWorkflow(a.workflowId, principal);
        if (!row || row.parentSessionId !== session.id) {
          throw new WorkflowStateError(
            "workflow_not_found",
            `workflow ${a.workflowId} is not a workflow of this session`,
          );
        }
        if (engine.run(a.workflowId)) {
          const outcome = await engine.cancel(a.workflowId, principal);
          return { content: outcome.summary ?? `Workflow ${a.workflowId} was superseded by a newer run.` };
        }
        const asked = await engine.requestCancel(a.workflowId, principal);
        if (asked === "not_running") {
          throw new WorkflowStateError("not_running", `workflow ${a.workflowId} is not running`);
        }
        return { content: `Cancel of workflow ${a.workflowId} requested; its summary arrives as a message.` };
      },
    },
  );
  const node = engine.nodeOfSession(session.id);
  const expansion = node ? engine.run(node.workflowId)?.journal.expansion : undefined;
  if (node && options.expansionAvailable !== false && expansion !== "none") {
    tools.push({
      name: "WorkflowAddNodes",
      description:
        "Add nodes to the workflow you are running in (they may depend on you or on existing nodes). Returns their ids once they are recorded.",
      parameters: parametersOf(addArgs),
      mutates: true,
      async execute(raw): Promise<ToolOutput> {
        const a = parse(addArgs, raw, "WorkflowAddNodes");
        const ids = await engine.addNodes({
          workflowId: node.workflowId,
          principalAccountId: principal,
          fromNodeId: node.nodeId,
          callerSessionId: session.id,
          nodes: a.nodes,
        });
        return { content: `Added nodes ${ids.join(", ")} to workflow ${node.workflowId}.` };
      },
    });
  }
  // A session that may start workflows reads the full results its summaries name; a running node, those of
  // the nodes it depends on, when one is stored.
  if (!node || readsDependencies(engine, node)) tools.push(workflowReadTool(engine, session));
  return tools;
}

/** Whether a running node has a dependency whose full result is stored (the path its prompt names). */
function readsDependencies(engine: WorkflowEngine, node: { workflowId: string; nodeId: string }): boolean {
  const journal = engine.run(node.workflowId)?.journal;
  const deps = journal?.nodes[node.nodeId]?.spec.dependsOn ?? [];
  return deps.some((dep) => journal?.nodes[dep]?.artifact !== undefined);
}

/**
 * `WorkflowRead`: a node's full result, by the `workflow-artifacts/…` path a handover or a summary names.
 * Only a version this session was granted can be read: the workflow's parent is granted every node's, a node
 * its direct dependencies' (never an upstream node's further away). Page by page; it never writes.
 */
function workflowReadTool(engine: WorkflowEngine, session: SessionRow): MutatingTool {
  return {
    name: "WorkflowRead",
    description:
      "Read the full result of a workflow node (the workflow-artifacts/… path after its handover, in a " +
      "workflow's summary or in your task), up to 64 KiB per call; continue with offset for the rest.",
    parameters: parametersOf(readArgs),
    mutates: false,
    subject: (args) => (typeof args.path === "string" ? args.path : undefined),
    async execute(raw): Promise<ToolOutput> {
      const a = parse(readArgs, raw, "WorkflowRead");
      const body = await engine.artifacts.readArtifact(session.id, a.path);
      if (body === null) {
        throw new WorkflowStateError(
          "artifact_not_granted",
          "WorkflowRead reaches only the full results of the workflows this session started and of the nodes it depends on",
          { path: a.path },
        );
      }
      const bytes = Buffer.from(body, "utf8");
      const offset = a.offset ?? 0;
      const limit = a.limit ?? SPILL_READ_PAGE;
      return {
        content: textPage(bytes.subarray(offset, offset + limit + 4), offset, bytes.length, limit, a.path),
      };
    },
  };
}
