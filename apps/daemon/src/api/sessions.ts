import { randomUUID } from "node:crypto";
import { parseDelegatedExecutionScope } from "@crw/brain";
import type { JournalEntry, SessionRow, TranscriptMessage } from "@crw/db";
import { z } from "zod";
import type { RpcContext, RpcRegistry } from "../rpc.js";
import type { DaemonRuntime } from "../runtime.js";
import { journalWakeKey } from "../wake.js";

// what a session row can hold (sessions.model and subagent_runs.model are 1..200 characters)
const modelName = z.string().min(1).max(200);
const sessionId = z.uuid();
const workDir = z.string().min(1).max(4096);

/** The working directory a session's durable scope records, if any. */
export function sessionWorkDir(session: SessionRow): string | null {
  return session.scope ? parseDelegatedExecutionScope(session.scope).workDir : null;
}
/** Bound of one tap: a view follows a session for at most this long per call (the client calls again). */
const TAP_MAX_MS = 6 * 60 * 60 * 1000;
/**
 * untilIdle: how soon the tap first looks again once the answer is in but the run or turn is still closing
 * (doubling while that lasts, up to the fallback bound).
 */
const TAP_SETTLING_RECHECK_MS = 50;

/** A transcript message as clients see it: role, text and tool calls, bounded. */
export function viewMessage(seq: number, m: TranscriptMessage): Record<string, unknown> {
  const clip = (s: string) => (s.length > 4000 ? `${s.slice(0, 4000)}… (${s.length} chars)` : s);
  switch (m.role) {
    case "user":
    case "custom":
      return {
        seq,
        role: m.role,
        text: clip(typeof m.content === "string" ? m.content : JSON.stringify(m.content)),
      };
    case "assistant":
      return {
        seq,
        role: "assistant",
        text: clip(
          m.content
            .filter((c) => c.type === "text")
            .map((c) => (c as { text: string }).text)
            .join(""),
        ),
        toolCalls: m.content
          .filter((c) => c.type === "toolCall")
          .map((c) => ({ id: (c as { id: string }).id, name: (c as { name: string }).name })),
      };
    case "toolResult":
      return {
        seq,
        role: "toolResult",
        toolName: m.toolName,
        toolCallId: m.toolCallId,
        isError: m.isError === true,
        text: clip(typeof m.content === "string" ? m.content : JSON.stringify(m.content)),
      };
    default:
      return { seq, role: (m as { role: string }).role };
  }
}

export function viewEntries(entries: readonly JournalEntry[]): Record<string, unknown>[] {
  return entries.flatMap((e) => (e.body.type === "message" ? [viewMessage(e.seq, e.body.message)] : []));
}

/**
 * Session methods. Every method that names a session reads it through the account-scoped repository first
 * (`getSession(id, ctx.accountId)`): another account's session is refused as not found before anything is
 * written, so a refused request changes nothing.
 */
export function registerSessionMethods(rpc: RpcRegistry, rt: DaemonRuntime, defaultModel: string): void {
  const own = (id: string, ctx: RpcContext) => rt.repo.getSession(id, ctx.accountId);

  rpc.register("session.create", {
    params: z.strictObject({ model: modelName.optional(), cwd: workDir.optional() }),
    handler: async (p, ctx) => {
      const s = await rt.service.createRootSession(ctx.accountId, p.model ?? defaultModel, {
        ...(p.cwd && { cwd: p.cwd }),
      });
      return { sessionId: s.id, model: s.model, cwd: sessionWorkDir(s) };
    },
  });

  rpc.register("session.send", {
    params: z.strictObject({
      sessionId,
      text: z.string().min(1).max(100_000),
      readOnly: z.boolean().optional(),
    }),
    handler: async (p, ctx) => {
      const session = await own(p.sessionId, ctx);
      if (session.kind !== "root")
        throw refused("not_root", "send messages to a root session; use tap to follow a child");
      const outcome = await rt.service.prompt(session.id, ctx.accountId, p.text, {
        readOnly: p.readOnly ?? false,
        progress: rt.progressSink((event) => ctx.notify("session.progress", event)),
      });
      return {
        stopReason: outcome.stopReason,
        errorMessage: outcome.errorMessage ?? null,
        reply: (await lastReply(rt, session.id, ctx.accountId)) ?? null,
      };
    },
  });

  rpc.register("session.delegate", {
    params: z.strictObject({
      sessionId,
      task: z.string().min(1).max(100_000),
      background: z.boolean().optional(),
      model: modelName.optional(),
      role: z.string().min(1).max(128).optional(),
      readOnly: z.boolean().optional(),
      /** Relative to the parent's working directory; the parent's own when absent. */
      cwd: workDir.optional(),
      isolation: z.enum(["none", "worktree"]).optional(),
    }),
    handler: async (p, ctx) => {
      const session = await own(p.sessionId, ctx);
      const receipt = await rt.service.delegate({
        ...(p.cwd && { workDir: p.cwd }),
        ...(p.isolation && { isolation: p.isolation }),
        parentSessionId: session.id,
        principalAccountId: ctx.accountId,
        toolCallId: `rpc-${randomUUID()}`,
        task: p.task,
        mode: p.background ? "background" : "foreground",
        ...(p.model ? { model: p.model } : {}),
        ...(p.role ? { role: p.role } : {}),
        ...(p.readOnly ? { readOnly: true } : {}),
        progress: rt.progressSink((event) => ctx.notify("session.progress", event)),
      });
      return receipt;
    },
  });

  // Ctrl+B: what the session's turn waits on in the foreground (Delegate calls, WorkflowStart) goes on in
  // the background; the turn goes on, and each result reaches the session through its inbox, once.
  rpc.register("session.background", {
    params: z.strictObject({ sessionId }),
    handler: async (p, ctx) => {
      const session = await own(p.sessionId, ctx);
      const [delegations, workflows] = await Promise.all([
        rt.service.moveForegroundOf(session.id, ctx.accountId),
        rt.engine.moveForegroundOf(session.id, ctx.accountId),
      ]);
      const answer = (m: { ok: true } | { ok: false; reason: string }) =>
        m.ok ? { moved: true } : { moved: false, reason: m.reason };
      return {
        delegations: delegations.map((d) => ({ runId: d.runId, ...answer(d.moved) })),
        workflows: workflows.map((w) => ({ workflowId: w.workflowId, ...answer(w.moved) })),
      };
    },
  });

  rpc.register("session.land", {
    params: z.strictObject({ sessionId }),
    handler: async (p, ctx) => {
      const landed = await rt.service.land(p.sessionId, ctx.accountId);
      return {
        branch: landed.branch,
        into: landed.into,
        before: landed.before,
        after: landed.after,
        fastForward: landed.fastForward,
        alreadyLanded: landed.alreadyLanded,
        changedPaths: landed.changedPaths,
        diff: landed.diff,
      };
    },
  });

  rpc.register("session.read", {
    params: z.strictObject({ sessionId, limit: z.number().int().min(1).max(1000).optional() }),
    handler: async (p, ctx) => {
      const session = await own(p.sessionId, ctx);
      const entries = await rt.repo.readJournal(session.id, ctx.accountId);
      const open =
        session.kind === "delegated" ? await rt.repo.openRunForChild(session.id, ctx.accountId) : null;
      return {
        session: {
          id: session.id,
          kind: session.kind,
          parentSessionId: session.parentSessionId,
          model: session.model,
          cwd: sessionWorkDir(session),
          createdAt: session.createdAt.toISOString(),
        },
        openRun: open ? { id: open.id, status: open.status } : null,
        reply: (await lastReply(rt, session.id, ctx.accountId)) ?? null,
        messages: viewEntries(entries).slice(-(p.limit ?? 50)),
      };
    },
  });

  /**
   * A session's status: its execution location (runner id and placement state, or this daemon's process)
   * merged with its delegation projection (the row, the open run) and the process projection of the runner
   * hosting it (load only: no pid, path or build identity).
   */
  rpc.register("session.status", {
    params: z.strictObject({ sessionId }),
    handler: async (p, ctx) => {
      const session = await own(p.sessionId, ctx);
      const open =
        session.kind === "delegated" ? await rt.repo.openRunForChild(session.id, ctx.accountId) : null;
      const execution = rt.executionFor(session.id);
      const runner =
        execution.location === "runner" && execution.runnerId !== null
          ? rt.runnerPool.health().runners.find((r) => r.runnerId === execution.runnerId)
          : undefined;
      return {
        sessionId: session.id,
        kind: session.kind,
        parentSessionId: session.parentSessionId,
        execution,
        delegation: open
          ? {
              runId: open.id,
              status: open.status,
              mode: open.mode,
              generation: open.generation,
              recoveryAttempts: open.recoveryAttempts,
            }
          : null,
        process: runner
          ? {
              runnerId: runner.runnerId,
              turns: runner.turns,
              sessions: runner.sessions,
              memoryBytes: runner.memoryBytes,
              memoryComplete: runner.memoryComplete,
            }
          : null,
      };
    },
  });

  /**
   * Fork-prefix diagnostics: the session's newest usage-bearing provider response (prompt tokens, share read
   * from the cache) and, for a fork, the parent's response whose prompt was the inherited prefix and whether
   * the fork read that prefix from the provider's cache (`prefixFromCache`; null when it cannot be judged).
   */
  rpc.register("session.forkPrefix", {
    params: z.strictObject({ sessionId }),
    handler: async (p, ctx) => {
      const session = await own(p.sessionId, ctx);
      return rt.service.forkPrefixDiagnostics(session.id, ctx.accountId);
    },
  });

  rpc.register("session.tap", {
    params: z.strictObject({
      sessionId,
      /** Journal rows after this seq are sent first (default: all). */
      afterSeq: z.number().int().min(0).optional(),
      /** End the tap when the session has no open call and its journal ends with an answer. */
      untilIdle: z.boolean().optional(),
    }),
    handler: async (p, ctx) => tap(rt, p, ctx),
  });
}

function refused(code: string, message: string): Error {
  return Object.assign(new Error(message), { name: "SessionRequestError", code });
}

async function lastReply(rt: DaemonRuntime, id: string, accountId: string): Promise<string | undefined> {
  const [last] = await rt.repo.recentAssistantMessages(id, accountId, 1);
  if (last?.message.role !== "assistant") return undefined;
  return last.message.content
    .filter((c) => c.type === "text")
    .map((c) => (c as { text: string }).text)
    .join("");
}

/**
 * Follows a session live: its journal rows as they commit (durable: the same whichever daemon or runner
 * runs the turn) and, in between, the live progress events this daemon sees. Read-only: it starts or
 * borrows no turn. Ends when the connection closes, after TAP_MAX_MS, or (untilIdle) once the session rests.
 *
 * No polling: it re-reads from its last seq when the journal wakes it (a write of this daemon, or another
 * process's commit through NOTIFY; see WakeHub), and at the latest after the hub's fallback bound. The
 * watch is opened before the first read, so a commit between a read and the wait is not missed.
 */
async function tap(
  rt: DaemonRuntime,
  p: { sessionId: string; afterSeq?: number | undefined; untilIdle?: boolean | undefined },
  ctx: RpcContext,
): Promise<{ lastSeq: number; idle: boolean }> {
  const session = await rt.repo.getSession(p.sessionId, ctx.accountId);
  let lastSeq = p.afterSeq ?? 0;
  const unsubscribe = rt.bus.subscribe(`session:${session.id}`, (event) =>
    ctx.notify("session.tap", { sessionId: session.id, live: event }),
  );
  const watch = rt.wake.watch(journalWakeKey(session.id));
  const deadline = Date.now() + TAP_MAX_MS;
  const ended = new AbortController();
  const onAbort = () => ended.abort();
  ctx.signal.addEventListener("abort", onAbort, { once: true });
  const timer = setTimeout(onAbort, TAP_MAX_MS);
  let answered = false;
  let settleDelay = TAP_SETTLING_RECHECK_MS / 2;
  try {
    for (;;) {
      const entries = await rt.repo.readJournal(session.id, ctx.accountId, { fromSeq: lastSeq + 1 });
      const fresh = entries.filter((e) => e.seq > lastSeq);
      for (const m of viewEntries(fresh)) ctx.notify("session.tap", { sessionId: session.id, message: m });
      const tail = fresh.at(-1);
      if (tail) {
        lastSeq = tail.seq;
        watch.seen(lastSeq);
        answered =
          tail.body.type === "message" &&
          tail.body.message.role === "assistant" &&
          !tail.body.message.content.some((c) => c.type === "toolCall");
      }
      let settling = false;
      if (p.untilIdle) {
        const open = await rt.repo.openRunForChild(session.id, ctx.accountId);
        if (!open && answered && !rt.service.turns.isBusy(session.id)) return { lastSeq, idle: true };
        // The answer is in but its run or turn has not let go yet: that ends without a journal row, so
        // nothing wakes the tap for it; it checks again shortly (only in this window, never while working).
        settling = answered;
      }
      if (ctx.signal.aborted || Date.now() > deadline) return { lastSeq, idle: false };
      settleDelay = settling ? Math.min(settleDelay * 2, rt.wake.fallbackMs) : TAP_SETTLING_RECHECK_MS / 2;
      await watch.next(ended.signal, settling ? settleDelay : undefined);
    }
  } finally {
    clearTimeout(timer);
    ctx.signal.removeEventListener("abort", onAbort);
    watch.close();
    unsubscribe();
  }
}
