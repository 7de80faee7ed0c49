import { randomUUID } from "node:crypto";
import {
  hostAccessors,
  parseWorkflowDefinition,
  readOrchestrationJournal,
  TERMINAL_WORKFLOW_STATUSES,
  type WorkflowEvent,
} from "@crw/plugin-subagent";
import { z } from "zod";
import type { RpcContext, RpcRegistry } from "../rpc.js";
import type { DaemonRuntime } from "../runtime.js";
import { journalWakeKey, workflowWakeKey } from "../wake.js";

/** Bound of one follow call; a client that wants longer calls again (the state is in the rows). */
const FOLLOW_MAX_MS = 6 * 60 * 60 * 1000;

interface NodeView {
  id: string;
  status: string;
  dependsOn?: string[];
  addedBy?: string;
  childSessionId?: string;
  error?: string;
}

/**
 * Node states from the orchestration journal while the workflow has one; after its terminal publication
 * the journal is gone and the published snapshot is what remains.
 */
async function nodeStates(
  rt: DaemonRuntime,
  workflowId: string,
): Promise<{ nodes: NodeView[]; run?: number; name?: string; reason?: string }> {
  const raw = await rt.engine.store.readJournal(workflowId);
  if (raw === null) {
    const row = await rt.engine.store.getWorkflow(workflowId);
    const snap = row?.snapshot as { nodes?: NodeView[]; run?: number; name?: string } | null | undefined;
    return {
      nodes: snap?.nodes ?? [],
      ...(snap?.run ? { run: snap.run } : {}),
      ...(snap?.name ? { name: snap.name } : {}),
    };
  }
  const reading = readOrchestrationJournal(raw);
  if (!reading.ok) return { nodes: [], reason: reading.reason };
  const j = reading.journal;
  return {
    nodes: j.order.map((id) => {
      const n = j.nodes[id];
      return {
        id,
        status: n?.status ?? "pending",
        dependsOn: n?.spec.dependsOn ?? [],
        ...(n?.addedBy ? { addedBy: n.addedBy } : {}),
        ...(n?.childSessionId ? { childSessionId: n.childSessionId } : {}),
        ...(n?.error ? { error: n.error.message } : {}),
      };
    }),
    run: j.run,
    name: j.name,
  };
}

/** How long a follow that has the summary waits for it to reach the parent session's journal. */
const SUMMARY_DELIVERY_WAIT_MS = 2_000;

/**
 * Waits (bounded) until the summary is delivered into the parent's journal, so a follower that returns
 * finds it in the session, as when it came back on a timer. A busy parent takes it after its turn: the
 * follow does not wait for that beyond the bound. Woken by the parent's journal writes.
 */
async function summaryDelivered(
  rt: DaemonRuntime,
  parentSessionId: string,
  accountId: string,
  resultId: string,
  signal: AbortSignal,
): Promise<void> {
  const watch = rt.wake.watch(journalWakeKey(parentSessionId));
  const deadline = Date.now() + SUMMARY_DELIVERY_WAIT_MS;
  try {
    for (;;) {
      const delivered = await rt.repo.settledResultIds(parentSessionId, accountId).catch(() => null);
      if (delivered === null || delivered.some((id) => id.toLowerCase() === resultId.toLowerCase())) return;
      const left = deadline - Date.now();
      if (left <= 0 || signal.aborted) return;
      await watch.next(signal, left);
    }
  } finally {
    watch.close();
  }
}

/**
 * Workflow methods: start from a definition (YAML or JSON text, parsed and validated whole by the plugin's
 * one schema before anything is created), status, follow (progress per node as notifications, then the
 * one whole-workflow summary) and cancel. A workflow is reachable only through its own account.
 */
export function registerWorkflowMethods(rpc: RpcRegistry, rt: DaemonRuntime, defaultModel: string): void {
  const ownWorkflow = async (workflowId: string, ctx: RpcContext) => {
    const row = await rt.engine.store.getWorkflow(workflowId, ctx.accountId);
    if (!row)
      throw Object.assign(new Error(`no workflow ${workflowId} in this account`), {
        name: "WorkflowRequestError",
        code: "workflow_not_found",
      });
    return row;
  };

  rpc.register("workflow.start", {
    params: z.strictObject({
      definition: z
        .string()
        .min(1)
        .max(1024 * 1024),
      format: z.enum(["yaml", "json"]).default("yaml"),
      /** The root session the summary is delivered to; a new one when absent. */
      sessionId: z.uuid().optional(),
      model: z.string().min(1).max(200).optional(),
      /** The workflow's working directory (its nodes' `cwd` resolve against it); else its session's. */
      cwd: z.string().min(1).max(4096).optional(),
    }),
    handler: async (p, ctx) => {
      // Refused definitions (cycles, unknown dependencies, duplicate ids, too large) throw here, typed, with
      // nothing created.
      const definition = parseWorkflowDefinition(p.definition, p.format);
      const session = p.sessionId
        ? await rt.repo.getSession(p.sessionId, ctx.accountId)
        : await rt.service.createRootSession(ctx.accountId, p.model ?? defaultModel, {
            ...(p.cwd && { cwd: p.cwd }),
          });
      // Placed (and refused) before anything is created: a session's workflow stays inside its project.
      const placement = await rt.service.placeUnder(session, p.sessionId ? p.cwd : undefined);
      const started = await rt.engine.start(
        {
          parentSessionId: session.id,
          principalAccountId: ctx.accountId,
          toolCallId: `rpc-${randomUUID()}`,
          currentAccess: () => rt.service.authorityFor(session),
          currentWorkDir: async () => placement?.workDir ?? null,
          // Node turns run in runners, but their tools (WorkflowAddNodes among them) execute here in the
          // daemon through the turn bridge, so a node extends its workflow locally.
          ...hostAccessors({
            completion: (c) =>
              rt.service.workflowSummaryQueued(c.parentSessionId, c.principalAccountId, c.resultId),
          }),
        },
        { definition },
      );
      return {
        workflowId: started.workflowId,
        sessionId: session.id,
        cwd: placement?.workDir ?? null,
        nodes: started.nodes,
      };
    },
  });

  rpc.register("workflow.status", {
    params: z.strictObject({ workflowId: z.uuid() }),
    handler: async (p, ctx) => {
      const row = await ownWorkflow(p.workflowId, ctx);
      return {
        workflowId: row.id,
        status: row.status,
        sessionId: row.parentSessionId,
        ...(await nodeStates(rt, row.id)),
      };
    },
  });

  rpc.register("workflow.land", {
    params: z.strictObject({ workflowId: z.uuid() }),
    handler: async (p, ctx) => {
      const row = await ownWorkflow(p.workflowId, ctx);
      return { workflowId: row.id, landed: await rt.engine.land(row.id, ctx.accountId) };
    },
  });

  rpc.register("workflow.cancel", {
    params: z.strictObject({ workflowId: z.uuid() }),
    handler: async (p, ctx) => {
      await ownWorkflow(p.workflowId, ctx);
      try {
        return await rt.engine.cancel(p.workflowId, ctx.accountId);
      } catch (e) {
        const err = e as { name?: unknown; code?: unknown };
        if (err.name !== "WorkflowStateError" || err.code !== "not_running") throw e;
        // Another daemon drives it: the stop is recorded on its row and that owner cancels it and delivers
        // the summary; this daemon answers that the stop was requested.
        const requested = await rt.engine.requestCancel(p.workflowId, ctx.accountId);
        return { status: requested, summary: null };
      }
    },
  });

  rpc.register("workflow.follow", {
    params: z.strictObject({ workflowId: z.uuid() }),
    handler: async (p, ctx) => {
      const row = await ownWorkflow(p.workflowId, ctx);
      const seen = new Map<string, string>();
      const report = (nodeId: string, status: string) => {
        if (seen.get(nodeId) === status) return;
        seen.set(nodeId, status);
        ctx.notify("workflow.progress", { workflowId: row.id, nodeId, status });
      };
      // Opened before the first read: a write committing between a read and the wait is not missed.
      const watch = rt.wake.watch(workflowWakeKey(row.id));
      const unsubscribe = rt.bus.subscribe(`workflow:${row.id}`, (raw) => {
        const event = raw as WorkflowEvent;
        if (event.type === "node") report(event.nodeId, event.status);
        // This daemon drives it: its event comes with (or just after) the write, so re-read now.
        rt.wake.wake(workflowWakeKey(row.id));
      });
      const deadline = Date.now() + FOLLOW_MAX_MS;
      const ended = new AbortController();
      const onAbort = () => ended.abort();
      ctx.signal.addEventListener("abort", onAbort, { once: true });
      const timer = setTimeout(onAbort, FOLLOW_MAX_MS);
      try {
        // The rows are the truth (the workflow may be driven by another daemon sharing the database); live
        // events and wakes (this daemon's events, other processes' writes through NOTIFY) only say when to
        // read them again, and the hub's fallback bound re-reads anyway. No polling loop.
        for (;;) {
          const current = await rt.engine.store.getWorkflow(row.id, ctx.accountId);
          const states = await nodeStates(rt, row.id);
          for (const n of states.nodes) report(n.id, n.status);
          if (current && TERMINAL_WORKFLOW_STATUSES.has(current.status) && current.summaryResultId) {
            await summaryDelivered(
              rt,
              row.parentSessionId,
              ctx.accountId,
              current.summaryResultId,
              ended.signal,
            );
            const summary = await rt.repo
              .getResult(current.summaryResultId, ctx.accountId)
              .then((r) => r.body)
              .catch(() => null);
            return {
              workflowId: row.id,
              status: current.status,
              sessionId: row.parentSessionId,
              summary,
              nodes: states.nodes,
            };
          }
          if (ctx.signal.aborted || Date.now() > deadline)
            return {
              workflowId: row.id,
              status: current?.status ?? "running",
              summary: null,
              nodes: states.nodes,
            };
          await watch.next(ended.signal);
        }
      } finally {
        clearTimeout(timer);
        ctx.signal.removeEventListener("abort", onAbort);
        watch.close();
        unsubscribe();
      }
    },
  });
}
