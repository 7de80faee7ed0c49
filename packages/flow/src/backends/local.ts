import { judgeAnswer } from "../engine/answer.js";
import { callRows } from "../engine/callFold.js";
import { DEADLINE } from "../engine/deadline.js";
import { hold, pauseForHeldCall } from "../engine/held.js";
import { type RunContext, RunStopped } from "../engine/runContext.js";
import { callFailed } from "../engine/workflow.js";
import { completionMembers } from "../engine/workspace.js";
import type { NewRow, RowOf, Tokens } from "../journal/rows.js";
import { WRITING_ROLES } from "../run/roles.js";
import { buildPacket, repairInput } from "../steps/packet.js";
import { digestOf } from "../util/canonical.js";
import { localModelConfig, providerFailureDetail } from "./localModel.js";
import { type LocalScript, readLocalScript, scriptFor } from "./localScript.js";

/** The model a local run uses when its spec names none: the offline scripted provider. */
export const DEFAULT_LOCAL_MODEL = "scripted";

const scripts = new Map<string, LocalScript>();

function scriptOf(path: string | null): LocalScript | null {
  if (!path) return null;
  let s = scripts.get(path);
  if (!s) {
    s = readLocalScript(path);
    scripts.set(path, s);
  }
  return s;
}

/** Token parts from the agent loop's usage; a part that is 0 is left out. */
function tokensOf(u: { input: number; output: number; cacheRead: number; totalTokens: number }): Tokens {
  const t: Tokens = {};
  if (u.input > 0) t.input = u.input;
  if (u.cacheRead > 0) t.cached_input = u.cacheRead;
  if (u.output > 0) t.output = u.output;
  if (u.totalTokens > 0) t.total = u.totalTokens;
  return t;
}

function addTokens(a: Tokens, b: Tokens): Tokens {
  const out: Tokens = {};
  for (const key of ["input", "cached_input", "output", "reasoning_output", "total"] as const) {
    const v = (a[key] ?? 0) + (b[key] ?? 0);
    if (v > 0) out[key] = v;
  }
  return out;
}

/**
 * Runs one call of a local run: crw runs the call's turns itself through `@crw/brain`'s agent loop and a
 * model provider (loaded only here, when a local call runs). The rows are the session call's own, read the
 * same way: thread_started (via: local) and turn_started of the task turn in one batch before the turn runs,
 * turn_started of a repair turn before it runs, then completed or null_model with the call's tokens; a
 * provider failure holds the call and pauses the run, as a host failure does on the session backend.
 *
 * A local turn lives in its process: one whose turn_started has no answer after it died with that process.
 * The resumed call writes the warning local_attempt_lost and runs the conversation again as the next
 * attempt, whose turns record the conversation turn they replace.
 */
export async function runLocalCall(rc: RunContext, call: string): Promise<unknown> {
  for (;;) {
    const rows = callRows(rc.rowsOf(call), call);
    const prepared = rows.find((r): r is RowOf<"prepared"> => r.type === "prepared");
    if (!prepared) throw new Error(`call ${call} has no prepared row`);
    const terminal = rows.findLast((r) => r.type === "completed" || r.type === "null_model");
    if (terminal?.type === "completed") return terminal.result;
    if (terminal?.type === "null_model") throw callFailed(terminal);
    if (rc.stopping) {
      // a call the stop reached between turns (or one a dead process left open) is held for its reason
      const lastOwn = rows.findLast((r) => r.type !== "run_paused");
      if (lastOwn?.type !== "held") hold(rc, call, undefined, rc.stopping.reason);
      throw new RunStopped(rc.stopping.reason);
    }
    const threads = rows.filter((r): r is RowOf<"thread_started"> => r.type === "thread_started");
    const turns = rows.filter((r): r is RowOf<"turn_started"> => r.type === "turn_started");
    const lastHeld = rows.findLast((r) => r.type === "held");
    const earlier: string[] = [];
    const last = threads[threads.length - 1];
    if (last) {
      const heldAfter = lastHeld && lastHeld.seq > last.seq;
      const reason = heldAfter ? `it was held (${lastHeld.reason})` : "its process ended before it answered";
      if (!heldAfter) {
        rc.append([
          {
            type: "flow_warning",
            warning: "local_attempt_lost",
            call,
            op: call,
            detail: { attempt: last.attempt, thread_id: last.thread_id, turns: turns.length },
          },
        ]);
      }
      earlier.push(`Attempt ${last.attempt} did not finish: ${reason}. This attempt starts the task again.`);
    }
    const replaced = turns.filter((t) => t.attempt === last?.attempt).map((t) => t.conversation_turn ?? 1);
    await runAttempt(rc, call, prepared, (last?.attempt ?? 0) + 1, turns.length, earlier, replaced);
  }
}

async function runAttempt(
  rc: RunContext,
  call: string,
  prepared: RowOf<"prepared">,
  attempt: number,
  turnsBefore: number,
  earlier: string[],
  replaced: number[],
): Promise<void> {
  const brain = await import("@crw/brain");
  const modelName = rc.spec.local?.model ?? DEFAULT_LOCAL_MODEL;
  const role = prepared.role;
  const pair = rc.pins[role];
  const workspace = prepared.allocation.workspace;
  const threadId = `local-${rc.runId}-${call}-a${attempt}`;
  let model: ReturnType<typeof brain.modelConfigFor>;
  if (modelName === "scripted") {
    model = { api: "scripted", script: scriptFor(scriptOf(rc.spec.local?.script ?? null), call) as never };
  } else model = localModelConfig(rc.spec.local, brain);
  const readOnly = !WRITING_ROLES.has(role);
  const scope = brain.captureDelegatedExecutionScope({
    accountId: "local",
    target: { kind: "host", ref: null },
    workDir: workspace,
    ...(readOnly ? { readOnly: true } : {}),
  });
  const systemPrompt = [
    `You are the ${role} of a crw flow run, working alone on one call of its workflow.`,
    "Follow the task packet you are given. Your final message is the JSON object its output contract names.",
  ].join("\n");
  let k = turnsBefore + 1;
  const marker = (kk: number) => `${call}/t${kk}-a${attempt}`;
  const turnRow = (kk: number, conversationTurn: number): NewRow => ({
    type: "turn_started",
    call,
    op: `${call}/t${kk}`,
    k: kk,
    turn_id: `${threadId}:t${kk}`,
    attempt,
    marker: marker(kk),
    conversation_turn: conversationTurn,
    ...(replaced.includes(conversationTurn) ? { replaces_turn: conversationTurn } : {}),
  });
  rc.append([
    {
      type: "thread_started",
      call,
      thread_id: threadId,
      model: modelName,
      effort: pair.effort,
      cwd: workspace,
      host_cwd: null,
      parent_thread_id: null,
      agent_role: role,
      attempt,
      via: "local",
      rollout_path: null,
      marker: marker(k),
    },
    turnRow(k, 1),
  ]);
  const packet = buildPacket({
    marker: marker(k),
    role,
    workspace,
    overlay: rc.table.roles[role].overlay,
    tmpdir: rc.spec.env ? { dir: rc.spec.env.TMPDIR, specPath: rc.paths.spec } : null,
    goRoot: rc.table.verifier
      ? { dir: rc.table.verifier.go_root, source: rc.table.source ?? "role store" }
      : null,
    earlierAttempts: earlier,
    task: prepared.input.task,
    repair: null,
    schema: prepared.input.schema,
  });
  let transcript: Parameters<typeof brain.runChildTurn>[0]["messages"] = [];
  let input = packet;
  let tokens: Tokens = {};
  // the attempt's deadline counts from its first turn; the run's stop aborts the turn too
  const deadlineMs = prepared.input.deadline_ms;
  const late = deadlineMs ? AbortSignal.timeout(deadlineMs) : null;
  const signal = late && rc.stopSignal ? AbortSignal.any([rc.stopSignal, late]) : (late ?? rc.stopSignal);
  /** The attempt ends held when the run stopped or its deadline passed: true when it did. */
  const heldByStop = (): boolean => {
    if (rc.stopping) hold(rc, call, tokens, rc.stopping.reason);
    else if (late?.aborted) {
      hold(rc, call, tokens, DEADLINE);
      pauseForHeldCall(rc, call);
    } else return false;
    return true;
  };
  for (let conversationTurn = 1; ; conversationTurn++) {
    const outcome = await brain.runChildTurn({
      sessionId: threadId,
      systemPrompt,
      messages: transcript,
      input,
      scope,
      workDir: workspace,
      model,
      readOnly,
      ...(signal ? { signal } : {}),
    });
    tokens = addTokens(tokens, tokensOf(outcome.usage));
    transcript = [...transcript, ...outcome.messages];
    // the run stopped (a pause, a cancel) or the deadline passed: the turn in flight was aborted with it
    if (outcome.stopReason === "aborted" && heldByStop()) return;
    if (outcome.stopReason === "error" || outcome.stopReason === "aborted") {
      const detail = providerFailureDetail(outcome.errorMessage ?? outcome.stopReason, rc.spec.local);
      rc.append([
        { type: "held", call, op: call, reason: "provider_failure", detail, tokens },
        { type: "run_paused", reason: `held:${call}`, call },
      ]);
      rc.emit({ type: "call_ended", call, status: "held (provider_failure)" });
      rc.stop(`held:${call}`);
      return;
    }
    const text = outcome.finalText;
    const verdict = judgeAnswer(text, prepared.input.schema);
    if (verdict.ok) {
      const members = await completionMembers(rc, call, prepared, attempt);
      rc.append([
        {
          type: "completed",
          call,
          op: call,
          k,
          attempt,
          result: verdict.value,
          result_digest: digestOf(verdict.value),
          raw_text: text,
          extracted: verdict.extracted,
          tokens,
          ...members,
        },
      ]);
      rc.emit({ type: "call_ended", call, status: "completed" });
      return;
    }
    if (conversationTurn === 2) {
      rc.append([
        {
          type: "null_model",
          call,
          op: call,
          reason: "answer_invalid_after_repair",
          raw_text: text,
          errors: verdict.errors,
          tokens,
        },
      ]);
      rc.emit({ type: "call_ended", call, status: "null_model" });
      return;
    }
    if (heldByStop()) return;
    // one repair, on the same conversation
    k++;
    rc.append([turnRow(k, 2)]);
    input = repairInput(text, verdict.errors);
  }
}
