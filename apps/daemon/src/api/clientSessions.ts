import { randomUUID } from "node:crypto";
import { type Delivered, openClientSession, takeResults } from "@crw/brain";
import type { QueuedResult, TakenResult } from "@crw/db";
import { z } from "zod";
import type { RpcContext, RpcRegistry } from "../rpc.js";
import type { DaemonRuntime } from "../runtime.js";
import { inboxWakeKey } from "../wake.js";
import { sessionWorkDir } from "./sessions.js";

const sessionId = z.uuid();
const modelName = z.string().min(1).max(200);
/** Bound of one `session.take` wait; a client that wants longer asks again (the results are in the rows). */
const TAKE_MAX_WAIT_S = 300;

/** A delivered result as a client sees it. `alreadyTaken`: handed out before this call. */
function viewResult(r: QueuedResult, journalSeq: number, alreadyTaken: boolean, takenAt?: Date) {
  return {
    resultId: r.id,
    kind: r.kind,
    childSessionId: r.childSessionId,
    runId: r.runId,
    toolCallId: r.toolCallId,
    outcome: r.outcome,
    body: r.body,
    byteSize: r.byteSize,
    spillPath: r.spillPath,
    journalSeq,
    alreadyTaken,
    ...(takenAt && { takenAt: takenAt.toISOString() }),
  };
}

/**
 * Methods of client-driven sessions (an MCP client is the session's model): open one by name, take its
 * results, continue and list its children. Every method reads the session through its account first.
 */
export function registerClientSessionMethods(
  rpc: RpcRegistry,
  rt: DaemonRuntime,
  defaultModel: string,
): void {
  const own = (id: string, ctx: RpcContext) => rt.repo.getSession(id, ctx.accountId);

  rpc.register("session.open", {
    params: z.strictObject({
      name: z.string().min(1).max(512),
      model: modelName.optional(),
      cwd: z.string().min(1).max(4096).optional(),
    }),
    handler: async (p, ctx) => {
      const { session, created } = await openClientSession(
        rt.service,
        ctx.accountId,
        p.name,
        p.model ?? defaultModel,
        {
          ...(p.cwd && { cwd: p.cwd }),
        },
      );
      return {
        sessionId: session.id,
        name: p.name,
        created,
        model: session.model,
        cwd: sessionWorkDir(session),
      };
    },
  });

  rpc.register("session.take", {
    params: z.strictObject({
      sessionId,
      /** With nothing waiting, wait this long for the next result. */
      waitSeconds: z.number().min(0).max(TAKE_MAX_WAIT_S).optional(),
      limit: z.number().int().min(1).max(100).optional(),
      /** Take only these (those still waiting; one already taken is left out). */
      resultIds: z.array(z.uuid()).min(1).max(100).optional(),
      /** Also answer the results taken at or after this time (marked `alreadyTaken`). */
      includeTakenSince: z.iso.datetime({ offset: true }).optional(),
    }),
    handler: async (p, ctx) => {
      const session = await own(p.sessionId, ctx);
      const before: TakenResult[] = p.includeTakenSince
        ? await rt.repo.takenResults(session.id, ctx.accountId, new Date(p.includeTakenSince), p.limit)
        : [];
      const waitMs = before.length > 0 ? 0 : (p.waitSeconds ?? 0) * 1000;
      // Watched before the first take: a result any process queues meanwhile wakes the wait at its commit.
      const news = waitMs > 0 ? rt.wake.watch(inboxWakeKey(session.id)) : undefined;
      let taken: Delivered[];
      try {
        taken = await takeResults(rt.service, session, {
          waitMs,
          ...(p.limit && { limit: p.limit }),
          ...(p.resultIds && { only: p.resultIds }),
          signal: ctx.signal,
          ...(news && {
            news: { wait: (signal, maxMs) => news.next(signal, Math.min(rt.wake.fallbackMs, maxMs)) },
          }),
        });
      } finally {
        news?.close();
      }
      return {
        sessionId: session.id,
        results: [
          ...before.map((r) => viewResult(r, r.journalSeq, true, r.takenAt)),
          ...taken.map((d) => viewResult(d.result, d.delivered.journalSeq, false)),
        ],
      };
    },
  });

  rpc.register("session.continue", {
    params: z.strictObject({
      sessionId,
      childSessionId: sessionId,
      text: z.string().min(1).max(100_000),
      background: z.boolean().optional(),
      model: modelName.optional(),
    }),
    handler: async (p, ctx) => {
      const session = await own(p.sessionId, ctx);
      return rt.service.continueSubagent({
        parentSessionId: session.id,
        principalAccountId: ctx.accountId,
        childSessionId: p.childSessionId,
        toolCallId: `rpc-${randomUUID()}`,
        text: p.text,
        mode: p.background ? "background" : "foreground",
        ...(p.model && { model: p.model }),
        progress: rt.progressSink((event) => ctx.notify("session.progress", event)),
      });
    },
  });

  rpc.register("session.children", {
    params: z.strictObject({ sessionId }),
    handler: async (p, ctx) => {
      const session = await own(p.sessionId, ctx);
      const children = await rt.repo.childrenOf(session.id, ctx.accountId);
      const workflows = await rt.engine.store.workflowsOfSession(session.id, ctx.accountId);
      return {
        sessionId: session.id,
        children: await Promise.all(
          children.map(async ({ child, latestRun }) => {
            const isolated = await rt.repo.isolatedWorktree(child.id, ctx.accountId);
            return {
              childSessionId: child.id,
              model: child.model,
              cwd: sessionWorkDir(child),
              branch: isolated?.branch ?? null,
              run: {
                runId: latestRun.id,
                kind: latestRun.kind,
                mode: latestRun.mode,
                status: latestRun.status,
                task: latestRun.task.length > 200 ? `${latestRun.task.slice(0, 200)}…` : latestRun.task,
                createdAt: latestRun.createdAt.toISOString(),
                settledAt: latestRun.settledAt?.toISOString() ?? null,
              },
              execution: rt.executionFor(child.id),
            };
          }),
        ),
        workflows: workflows.map((w) => ({
          workflowId: w.id,
          name: w.name,
          status: w.status,
        })),
      };
    },
  });
}
