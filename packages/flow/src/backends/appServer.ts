import { answerText, judgeAnswer } from "../engine/answer.js";
import { callRows } from "../engine/callFold.js";
import { attemptDeadline, DEADLINE, pastDeadline } from "../engine/deadline.js";
import { hold, pauseForHeldCall } from "../engine/held.js";
import { type RunContext, RunStopped } from "../engine/runContext.js";
import { callFailed } from "../engine/workflow.js";
import { completionMembers } from "../engine/workspace.js";
import type { AppServerHost } from "../host/appServerHost.js";
import type { HostThread, HostTurn } from "../host/sessionHost.js";
import type { NewRow, RowOf, Tokens } from "../journal/rows.js";
import { markerInText, markerLine, markerOf } from "../steps/message.js";
import { repairInput, repositoryTools } from "../steps/packet.js";
import { digestOf } from "../util/canonical.js";
import { FlowError } from "../util/errors.js";
import { threadTokenTotal } from "./appServerTokens.js";

function appServerHost(rc: RunContext): AppServerHost {
  const h = rc.host as Partial<AppServerHost>;
  if (typeof h.startThread !== "function" || typeof h.resumeThread !== "function") {
    throw new FlowError("host", "the app-server backend needs the app-server host adapter", 1);
  }
  return rc.host as AppServerHost;
}

/** The run's environment entries (TMPDIR first, then go's) and the tools section that names them. */
function toolsOf(rc: RunContext) {
  return repositoryTools(
    rc.spec.env ? { dir: rc.spec.env.TMPDIR, specPath: rc.paths.spec } : null,
    rc.table.verifier ? { dir: rc.table.verifier.go_root, source: rc.table.source ?? "role store" } : null,
  );
}

function envOf(rc: RunContext): Record<string, string> {
  return Object.fromEntries(toolsOf(rc)?.entries ?? []);
}

/** The section every turn text ends with: the entries the thread's shell has, and the prefix. */
function toolsSection(rc: RunContext): string {
  const tools = toolsOf(rc);
  if (!tools) return "";
  return [
    "## Repository tools",
    "",
    ...tools.facts.map((f) => `- ${f}`),
    "",
    "Your shell has these environment entries; put this prefix in front of every command as well:",
    "",
    "```",
    tools.prefix,
    "```",
    "",
    ...tools.entries.map(([k, v]) => `- ${k}=${v}`),
    "",
  ].join("\n");
}

/** A turn's text: the marker line, the input (the task and its contract, or a repair), then the tools. */
function turnText(
  rc: RunContext,
  marker: string,
  prepared: RowOf<"prepared">,
  repair: string | null,
): string {
  const body =
    repair ??
    [
      "## Task",
      "",
      prepared.input.task,
      "",
      "## Output contract",
      "",
      "Your final message is exactly one JSON object and nothing else.",
      ...(prepared.input.schema
        ? [
            "It must be valid against this JSON Schema:",
            "",
            "```json",
            JSON.stringify(prepared.input.schema, null, 2),
            "```",
          ]
        : []),
      "",
    ].join("\n");
  const tools = toolsSection(rc);
  return `${markerLine(marker)}\n${body}${tools ? `\n${tools}` : ""}`;
}

function turnByMarker(thread: HostThread, marker: string): HostTurn | undefined {
  return thread.turns.find((t) => {
    const first = t.items.find((i) => i.type === "userMessage");
    return first?.type === "userMessage" && markerInText(first.text) === marker;
  });
}

/**
 * Runs one call of an app-server run: the engine opens a Codex thread per call attempt (thread/start with
 * the call's pair and the run's environment entries as `shell_environment_policy.set.<NAME>` leaf keys)
 * and runs the turns itself (turn/start), reading the thread until the marker turn ends. The rows are the
 * session call's: thread_started (via: app-server) once the thread exists, turn_started once the turn
 * exists, completed / null_model with the tokens of thread/tokenUsage/updated, session_attempt_lost for a
 * thread the host no longer knows, held + run_paused for a failed turn.
 *
 * A process that resumes the call follows the thread its rows name with thread/resume carrying the same
 * leaf keys (taken from the run, stored nowhere): after an App Server restart the host rebuilds the thread
 * from its own configuration, and the resume puts the entries back. A turn started but not recorded (the
 * process died in between) is found on the thread by its marker and adopted, never started twice.
 */
export async function runAppServerCall(rc: RunContext, call: string): Promise<unknown> {
  const host = appServerHost(rc);
  const followed = new Set<string>();
  const missingSince = new Map<string, number>();
  for (;;) {
    const rows = callRows(rc.rowsOf(call), call);
    const prepared = rows.find((r): r is RowOf<"prepared"> => r.type === "prepared");
    if (!prepared) throw new Error(`call ${call} has no prepared row`);
    const terminal = rows.findLast((r) => r.type === "completed" || r.type === "null_model");
    if (terminal?.type === "completed") return terminal.result;
    if (terminal?.type === "null_model") throw callFailed(terminal);
    if (rc.stopping) {
      await stopAppServerCall(rc, host, call, rows);
      throw new RunStopped(rc.stopping.reason);
    }
    const thread = rows.findLast((r): r is RowOf<"thread_started"> => r.type === "thread_started");
    const lost = rows.some((r) => r.type === "session_attempt_lost" && r.attempt === thread?.attempt);
    const held = rows.findLast((r) => r.type === "held");
    const k = rows.filter((r) => r.type === "turn_started").length + 1;
    if (!thread || lost || (held && held.seq > thread.seq)) {
      const attempt = (thread?.attempt ?? 0) + 1;
      const pair = rc.pins[prepared.role];
      const started = await host.startThread({
        cwd: prepared.allocation.workspace,
        model: pair.model,
        reasoningEffort: pair.effort,
        env: envOf(rc),
      });
      if (!started.ok) {
        await rc.nap();
        continue;
      }
      followed.add(started.value.id);
      rc.append([
        {
          type: "thread_started",
          call,
          thread_id: started.value.id,
          model: started.value.model ?? pair.model,
          effort: started.value.reasoningEffort ?? pair.effort,
          cwd: prepared.allocation.workspace,
          host_cwd: started.value.cwd,
          parent_thread_id: null,
          agent_role: prepared.role,
          attempt,
          via: "app-server",
          rollout_path: started.value.rolloutPath,
          marker: markerOf(call, k, attempt),
        },
      ]);
      continue;
    }
    if (!followed.has(thread.thread_id)) {
      // a thread an earlier process opened: resume it with the run's entries (the host keeps none)
      const resumed = await host.resumeThread(thread.thread_id, { env: envOf(rc) });
      if (!resumed.ok && resumed.reason === "unknown_thread") {
        lose(rc, call, thread, k, null, "thread_unknown", "unknown", null);
        continue;
      }
      if (!resumed.ok) {
        await rc.nap();
        continue;
      }
      followed.add(thread.thread_id);
    }
    if (pastDeadline(attemptDeadline(prepared, thread))) {
      await stopAppServerCall(rc, host, call, rows, DEADLINE);
      pauseForHeldCall(rc, call);
      continue;
    }
    const turns = rows.filter(
      (r): r is RowOf<"turn_started"> => r.type === "turn_started" && r.attempt === thread.attempt,
    );
    const seen = rc.hostVersion(thread.thread_id);
    const read = await host.readThread(thread.thread_id);
    if (!read.ok) {
      if (read.reason === "unknown_thread")
        lose(rc, call, thread, k, null, "thread_unknown", "unknown", null);
      else await rc.nap();
      continue;
    }
    const last = turns[turns.length - 1];
    if (!last) {
      await startTurn(rc, host, call, prepared, thread, read.value, k, 1, null);
      continue;
    }
    const t = read.value.turns.find((x) => x.id === last.turn_id);
    /** The attempt is lost once the thread has shown no activity, and the turn stayed so, for LostAfter. */
    const loseAfterLostAfter = async (reason: "turn_unknown" | "turn_interrupted"): Promise<void> => {
      const since = missingSince.get(last.turn_id) ?? Date.now();
      missingSince.set(last.turn_id, since);
      if (read.value.status.type !== "active" && Date.now() - since >= rc.lostAfterMs) {
        lose(rc, call, thread, last.k, last.turn_id, reason, read.value.status.type, t?.status ?? null);
      } else await rc.nap();
    };
    if (!t) {
      // a turn just started may not be listed yet (the server lists turns from the rollout); only a thread
      // that shows no activity and no such turn for LostAfter loses the attempt
      await loseAfterLostAfter("turn_unknown");
      continue;
    }
    if (t.status === "inProgress") {
      await rc.hostNap(thread.thread_id, seen);
      continue;
    }
    if (t.status === "interrupted" && !t.error) {
      // nobody here interrupted it: a server that went away ends a running turn this way, but the server
      // also reads a turn it has just started as interrupted for a moment. As on the session backend, an
      // interrupted turn without an error is judged after LostAfter: then the attempt is lost and the next
      // one opens a new thread.
      await loseAfterLostAfter("turn_interrupted");
      continue;
    }
    missingSince.delete(last.turn_id);
    if (t.status !== "completed") {
      rc.append([
        {
          type: "held",
          call,
          op: call,
          reason: "host_failure",
          detail: `${t.error?.codexErrorInfo ?? t.status}: ${t.error?.message ?? ""}`,
        },
        { type: "run_paused", reason: `held:${call}`, call },
      ]);
      rc.emit({ type: "call_ended", call, status: "held (host_failure)" });
      rc.stop(`held:${call}`);
      continue;
    }
    const tokens = await tokensOf(rc, host, call, read.value, last);
    const text = answerText(t);
    const verdict = judgeAnswer(text, prepared.input.schema);
    if (verdict.ok) {
      const members = await completionMembers(rc, call, prepared, thread.attempt);
      rc.append([
        {
          type: "completed",
          call,
          op: call,
          k: last.k,
          attempt: thread.attempt,
          result: verdict.value,
          result_digest: digestOf(verdict.value),
          raw_text: verdict.text,
          extracted: verdict.extracted,
          tokens,
          ...members,
        },
      ]);
      rc.emit({ type: "call_ended", call, status: "completed" });
      continue;
    }
    if ((last.conversation_turn ?? 1) >= 2) {
      rc.append([
        {
          type: "null_model",
          call,
          op: call,
          reason: "answer_invalid_after_repair",
          ...(text !== null ? { raw_text: text } : {}),
          errors: verdict.errors,
          tokens,
        },
      ]);
      rc.emit({ type: "call_ended", call, status: "null_model" });
      continue;
    }
    await startTurn(
      rc,
      host,
      call,
      prepared,
      thread,
      read.value,
      k,
      2,
      repairInput(text ?? "", verdict.errors),
    );
  }
}

/**
 * A pause (a held call elsewhere, a usage limit, the token ceiling, a cancel) or the call's own deadline
 * stops the call: a turn the call is running is interrupted (the interrupt_requested row is durable
 * before turn/interrupt goes out) and its thread read until the turn runs no more; then the call is held
 * for the reason, so a resume goes on with a new attempt. A call that is already held stays as it is.
 */
async function stopAppServerCall(
  rc: RunContext,
  host: AppServerHost,
  call: string,
  rows: ReturnType<typeof callRows>,
  reason: string = rc.stopping?.reason ?? "stopped",
): Promise<void> {
  const lastOwn = rows.findLast((r) => r.type !== "run_paused");
  if (lastOwn?.type === "held") return;
  const thread = rows.findLast((r): r is RowOf<"thread_started"> => r.type === "thread_started");
  const turn = thread
    ? rows.findLast(
        (r): r is RowOf<"turn_started"> =>
          r.type === "turn_started" && r.attempt === thread.attempt && r.seq > thread.seq,
      )
    : undefined;
  if (thread && turn) {
    const read = await host.readThread(thread.thread_id);
    const t = read.ok ? read.value.turns.find((x) => x.id === turn.turn_id) : undefined;
    if (t?.status === "inProgress") {
      rc.append([
        {
          type: "interrupt_requested",
          call,
          op: turn.op,
          reason,
          k: turn.k,
          attempt: turn.attempt,
          turn_id: turn.turn_id,
        },
      ]);
      await host.interruptTurn(thread.thread_id, turn.turn_id);
      const deadline = Date.now() + rc.lostAfterMs;
      while (Date.now() < deadline) {
        const seen = rc.hostVersion(thread.thread_id);
        const again = await host.readThread(thread.thread_id);
        if (!again.ok) break;
        const t2 = again.value.turns.find((x) => x.id === turn.turn_id);
        if (again.value.status.type !== "active" && t2?.status !== "inProgress") break;
        await rc.hostNap(thread.thread_id, seen);
      }
    }
  }
  hold(rc, call, undefined, reason);
}

async function startTurn(
  rc: RunContext,
  host: AppServerHost,
  call: string,
  prepared: RowOf<"prepared">,
  thread: RowOf<"thread_started">,
  hostThread: HostThread,
  k: number,
  conversationTurn: number,
  repair: string | null,
): Promise<void> {
  const marker = markerOf(call, k, thread.attempt);
  const replaced = callRows(rc.rowsOf(call), call).some(
    (r) => r.type === "turn_started" && (r.conversation_turn ?? 1) === conversationTurn,
  );
  const row = (turnId: string): NewRow => ({
    type: "turn_started",
    call,
    op: `${call}/t${k}`,
    k,
    turn_id: turnId,
    attempt: thread.attempt,
    marker,
    conversation_turn: conversationTurn,
    ...(replaced ? { replaces_turn: conversationTurn } : {}),
  });
  // a turn an earlier process started and did not record is adopted, never started twice
  const existing = turnByMarker(hostThread, marker);
  if (existing) {
    rc.append([row(existing.id)]);
    return;
  }
  const started = await host.startTurn(thread.thread_id, turnText(rc, marker, prepared, repair));
  if (!started.ok) {
    await rc.nap();
    return;
  }
  rc.append([row(started.value.turnId)]);
}

async function tokensOf(
  rc: RunContext,
  host: AppServerHost,
  call: string,
  thread: HostThread,
  turn: RowOf<"turn_started">,
): Promise<Tokens> {
  const noted = threadTokenTotal(thread.id);
  if (noted) return noted;
  // a process that did not see the notification (it resumed after the turn ended) reads the rollout
  const tc = await host.readTokenCount(thread);
  if (tc.ok && tc.value) {
    const t: Tokens = {};
    for (const [k, v] of Object.entries(tc.value)) if (v > 0) t[k as keyof Tokens] = v;
    return t;
  }
  rc.append([
    {
      type: "tokens_unmeasured",
      call,
      op: call,
      k: turn.k,
      turn_id: turn.turn_id,
      pauses: false,
      reason: tc.ok
        ? "no thread/tokenUsage/updated and no token_count in the rollout"
        : `${tc.reason}: ${tc.message}`,
    },
  ]);
  return {};
}

function lose(
  rc: RunContext,
  call: string,
  thread: RowOf<"thread_started">,
  k: number,
  turnId: string | null,
  reason: string,
  hostStatus: string,
  turnStatus: string | null,
): void {
  rc.append([
    {
      type: "session_attempt_lost",
      call,
      op: call,
      attempt: thread.attempt,
      agent_id: thread.thread_id,
      k,
      turn_id: turnId,
      reason,
      host_status: hostStatus,
      turn_status: turnStatus,
    },
  ]);
  rc.emit({ type: "attempt_lost", call, attempt: thread.attempt, reason });
}
