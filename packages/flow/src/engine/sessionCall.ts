import type { HostThread, HostTurn } from "../host/sessionHost.js";
import type { NewRow, RowOf, Tokens } from "../journal/rows.js";
import { markerOf, sendInputMessage, spawnMessage } from "../steps/message.js";
import { buildPacket, repairInput } from "../steps/packet.js";
import { packetPath } from "../steps/stepBus.js";
import { digestOf, sha256 } from "../util/canonical.js";
import { sleep } from "../util/fsx.js";
import { answerText, parseAnswer, validateAgainst } from "./answer.js";
import { judgeBind, markerTurn } from "./bind.js";
import {
  addTokens,
  type CallFold,
  type CallPosition,
  foldCall,
  type NextStep,
  subtractTokens,
} from "./callFold.js";
import { answerReports, type BindHandler } from "./reports.js";
import { type RunContext, RunStopped } from "./runContext.js";
import { FlowCallError } from "./workflow.js";

type Step = RowOf<"step_published">;

/** In-memory bookkeeping of one step's files; a resumed process starts it unwritten (it writes them again). */
interface StepFiles {
  written: boolean;
  /** When this process began to wait for the step (0 for a step a resumed process found waiting). */
  since: number;
  failures: number;
  firstAt: string | null;
  lastAt: string | null;
  warned: boolean;
  lastError: string;
}

/**
 * Runs one session call to its terminal row: publish a step, bind the subagent the owner reports (or that
 * the host shows carrying the marker), harvest its marker turn, validate with one repair. Every move is
 * decided from the call's rows (`foldCall`), so a process that resumes the call from the journal makes the
 * same move the dead one would have.
 */
export async function runSessionCall(rc: RunContext, call: string): Promise<unknown> {
  const files = new Map<string, StepFiles>();
  const lostClock = new Map<string, { sig: string; since: number }>();
  let retracted = "";
  const lookedUp = new Set<string>();
  for (;;) {
    const fold = foldCall(rc.rowsOf(call));
    const pos = fold.position;
    if (!pos || !fold.prepared) throw new Error(`call ${call} has no prepared row`);
    if (pos.kind === "terminal") {
      if (pos.row.type === "completed") return pos.row.result;
      throw new FlowCallError(pos.row.op, pos.row.reason);
    }
    if (rc.stopping) {
      await stopCall(rc, call, fold, pos, files);
      throw new RunStopped(rc.stopping.reason);
    }
    switch (pos.kind) {
      case "publish": {
        const first = pos.next.lookupFirst;
        if (first && !lookedUp.has(first.marker)) {
          // a held call's step that was published and not bound is looked up by its marker first
          lookedUp.add(first.marker);
          if (await lookUp(rc, call, fold, first)) break;
        }
        publish(rc, call, fold, pos.next, files);
        break;
      }
      case "await_bind":
        await awaitBind(rc, call, fold, pos.step, files);
        break;
      case "adopt":
        await adopt(rc, call, pos, lostClock);
        break;
      case "harvest":
        if (retracted !== pos.step.marker) {
          rc.bus.retractStep(call, pos.step.k, pos.step.attempt);
          closeUnwritten(rc, call, pos.step, files, true);
          retracted = pos.step.marker;
        }
        await harvest(rc, call, fold, pos, lostClock);
        break;
    }
  }
}

function publish(
  rc: RunContext,
  call: string,
  fold: CallFold,
  next: NextStep,
  files: Map<string, StepFiles>,
): void {
  const prepared = fold.prepared as RowOf<"prepared">;
  for (const c of next.close) {
    rc.bus.writeClose({ run_id: rc.runId, call, attempt: c.attempt, action: "close", agent_id: c.agent_id });
  }
  const role = prepared.role;
  const entry = rc.table.roles[role];
  const pair = rc.pins[role];
  const marker = markerOf(call, next.k, next.attempt);
  const packet = packetPath(rc.paths.steps, call, next.k, next.attempt);
  const workspace = prepared.allocation.workspace;
  const earlier: string[] = [];
  if (next.note) earlier.push(next.note);
  if (next.note && role.startsWith("executor")) {
    earlier.push(
      `Read git -C ${workspace} status and the diff first: the previous attempt may have changed files.`,
    );
  }
  const packetText = buildPacket({
    marker,
    role,
    workspace,
    overlay: entry.overlay,
    tmpdir: rc.spec.env ? { dir: rc.spec.env.TMPDIR, specPath: rc.paths.spec } : null,
    goRoot: rc.table.verifier
      ? { dir: rc.table.verifier.go_root, source: rc.table.source ?? "role store" }
      : null,
    earlierAttempts: earlier,
    task: prepared.input.task,
    repair: next.repair ?? null,
    schema: prepared.input.schema,
  });
  const input = next.repair ? repairInput(next.repair.answer, next.repair.errors) : prepared.input.task;
  const row: NewRow = {
    type: "step_published",
    call,
    op: `${call}/t${next.k}`,
    k: next.k,
    marker,
    attempt: next.attempt,
    action: next.action,
    input,
    input_digest: sha256(input),
    packet,
    packet_digest: sha256(packetText),
    role,
    agent_type: entry.agent_type,
    model: pair.model,
    effort: pair.effort,
    workspace,
    ...(next.action === "send_input" && next.agent_id ? { agent_id: next.agent_id } : {}),
    ...(next.note ? { note: next.note } : {}),
    ...(next.previous_answer !== undefined ? { previous_answer: next.previous_answer } : {}),
    ...(next.repair ? { repair: next.repair } : {}),
    ...(next.tokens_seen ? { tokens_seen: next.tokens_seen } : {}),
    ...(next.call_tokens ? { call_tokens: next.call_tokens } : {}),
    conversation_turn: next.conversation_turn,
    ...(next.replaces_turn !== undefined ? { replaces_turn: next.replaces_turn } : {}),
  };
  const [written] = rc.append([row]);
  rc.emit({ type: "step_published", call, marker, action: next.action });
  const state: StepFiles = {
    written: false,
    since: Date.now(),
    failures: 0,
    firstAt: null,
    lastAt: null,
    warned: false,
    lastError: "",
  };
  files.set(marker, state);
  writeStepFiles(rc, written as Step, packetText, state);
}

function packetTextOf(rc: RunContext, _call: string, step: Step, fold: CallFold): string {
  const prepared = fold.prepared as RowOf<"prepared">;
  const entry = rc.table.roles[prepared.role];
  const earlier: string[] = [];
  if (step.note) earlier.push(step.note);
  if (step.note && prepared.role.startsWith("executor")) {
    earlier.push(
      `Read git -C ${step.workspace} status and the diff first: the previous attempt may have changed files.`,
    );
  }
  return buildPacket({
    marker: step.marker,
    role: prepared.role,
    workspace: step.workspace,
    overlay: entry.overlay,
    tmpdir: rc.spec.env ? { dir: rc.spec.env.TMPDIR, specPath: rc.paths.spec } : null,
    goRoot: rc.table.verifier
      ? { dir: rc.table.verifier.go_root, source: rc.table.source ?? "role store" }
      : null,
    earlierAttempts: earlier,
    task: prepared.input.task,
    repair: step.repair ?? null,
    schema: prepared.input.schema,
  });
}

/** Writes a step's packet and file; a failure is recorded at the 1st, 10th, 100th … failure. */
function writeStepFiles(rc: RunContext, step: Step, packetText: string, state: StepFiles): void {
  const message =
    step.action === "spawn"
      ? spawnMessage(step.marker, step.role, step.workspace, step.packet)
      : sendInputMessage(step.marker, step.input);
  try {
    rc.bus.writeStep(
      {
        run_id: rc.runId,
        call: step.call,
        k: step.k,
        attempt: step.attempt,
        op: step.op,
        marker: step.marker,
        role: step.role,
        action: step.action,
        agent_type: step.agent_type,
        model: step.model,
        reasoning_effort: step.effort,
        message,
        packet: step.packet,
        workspace: step.workspace,
        agent_id: step.agent_id ?? null,
      },
      packetText,
    );
    state.written = true;
    if (state.warned) closeUnwritten(rc, step.call, step, new Map([[step.marker, state]]), true);
  } catch (e) {
    const now = new Date().toISOString();
    state.failures++;
    state.firstAt ??= now;
    state.lastAt = now;
    state.lastError = (e as Error).message;
    if (isPowerOfTen(state.failures)) {
      state.warned = true;
      rc.append([unwrittenRow(step, state)]);
    }
  }
}

function isPowerOfTen(n: number): boolean {
  let x = n;
  while (x >= 10 && x % 10 === 0) x /= 10;
  return x === 1;
}

function unwrittenRow(step: Step, state: StepFiles, written?: boolean): NewRow {
  return {
    type: "step_unwritten",
    call: step.call,
    marker: step.marker,
    k: step.k,
    attempt: step.attempt,
    action: step.action,
    input_state: "not_delivered",
    error: state.lastError,
    failures: state.failures,
    first_at: state.firstAt ?? new Date().toISOString(),
    last_at: state.lastAt ?? new Date().toISOString(),
    ...(written !== undefined ? { written } : {}),
  };
}

/** The closing step_unwritten row of a step that was warned about: written true, or false when it ends. */
function closeUnwritten(
  rc: RunContext,
  call: string,
  step: Step,
  files: Map<string, StepFiles>,
  written: boolean,
): void {
  const state = files.get(step.marker);
  if (!state?.warned) return;
  rc.append([unwrittenRow(step, state, written)]);
  state.warned = false;
  void call;
}

async function awaitBind(
  rc: RunContext,
  call: string,
  fold: CallFold,
  step: Step,
  files: Map<string, StepFiles>,
) {
  let state = files.get(step.marker);
  const resumed = !state;
  if (!state) {
    state = {
      written: false,
      since: 0,
      failures: 0,
      firstAt: null,
      lastAt: null,
      warned: false,
      lastError: "",
    };
    files.set(step.marker, state);
  }
  // A report the owner wrote first, then the host's own record of the marker.
  const onBind: BindHandler = (thread, verdict) => bind(rc, call, fold, step, thread, verdict);
  if (await answerReports(rc, call, step, onBind)) return;
  // The owner normally reports; the host lookup is the fallback, so a fresh step waits a while for it.
  if (Date.now() - state.since >= rc.lookupEveryMs) {
    state.since = Date.now();
    if (await lookUp(rc, call, fold, step)) return;
  }
  if (!state.written) {
    writeStepFiles(rc, step, packetTextOf(rc, call, step, fold), state);
    if (resumed && state.written)
      rc.emit({ type: "step_published", call, marker: step.marker, action: step.action });
  }
  await sleep(rc.pollMs);
}

/** While a step waits, the marker is looked up on the host so an unreported spawn or repair binds too. */
async function lookUp(rc: RunContext, call: string, fold: CallFold, step: Step): Promise<boolean> {
  const pair = rc.pins[step.role];
  let candidates: HostThread[];
  if (step.action === "send_input" && step.agent_id) {
    const r = await rc.host.readThread(step.agent_id);
    if (!r.ok) return false;
    candidates = [r.value];
  } else {
    // The owner thread's spawnAgent items name the subagent that took the marker: one read of the owner
    // and one of each candidate, instead of a read of every subagent the owner ever spawned.
    const r = await rc.spawnedFor(step.marker);
    if (!r.ok) return false;
    candidates = r.value.filter((t) => markerTurn(t, step.marker) !== null);
    const bound = new Set(foldCall(rc.rowsOf(call)).threads.map((t) => t.thread_id));
    candidates = candidates.filter((t) => !bound.has(t.id));
    if (candidates.length > 1)
      rc.append([{ type: "session_host_warning", op: step.op, warnings: ["several_spawns"] }]);
  }
  for (const thread of candidates) {
    const v = judgeBind(step, thread, rc.owner, pair);
    if (v.verdict === "bind") {
      bind(rc, call, fold, step, thread, v);
      rc.emit({ type: "bound", call, marker: step.marker, agent: thread.id, via: "lookup" });
      return true;
    }
  }
  return false;
}

/** Writes the bind rows in one batch (thread_started for a spawn, turn_started always), then retracts. */
function bind(
  rc: RunContext,
  call: string,
  fold: CallFold,
  step: Step,
  thread: HostThread,
  v: Extract<ReturnType<typeof judgeBind>, { verdict: "bind" }>,
): void {
  const rows: NewRow[] = [];
  if (step.action === "spawn") {
    const priorPairs = fold.threads
      .map((t) => ({ model: t.model, effort: t.effort }))
      .filter((p) => p.model !== thread.model || p.effort !== thread.reasoningEffort);
    rows.push({
      type: "thread_started",
      call,
      thread_id: thread.id,
      model: thread.model,
      effort: thread.reasoningEffort,
      cwd: step.workspace,
      host_cwd: thread.cwd,
      parent_thread_id: thread.parentThreadId,
      agent_role: thread.agentRole,
      attempt: step.attempt,
      via: "session",
      rollout_path: thread.rolloutPath,
      marker: step.marker,
      ...(v.pairUnchecked ? { pair_unchecked: true } : {}),
      ...(v.effortUnchecked ? { effort_unchecked: true } : {}),
      ...(v.agentRoleMismatch ? { session_agent_role_mismatch: v.agentRoleMismatch } : {}),
      ...(priorPairs.length > 0 ? { prior_pairs: priorPairs } : {}),
    });
  }
  rows.push(turnStartedRow(call, step, v.turn.id));
  rc.append(rows);
  rc.bus.retractStep(call, step.k, step.attempt);
}

function turnStartedRow(call: string, step: Step, turnId: string): NewRow {
  return {
    type: "turn_started",
    call,
    op: step.op,
    k: step.k,
    turn_id: turnId,
    attempt: step.attempt,
    marker: step.marker,
    conversation_turn: step.conversation_turn,
    ...(step.replaces_turn !== undefined ? { replaces_turn: step.replaces_turn } : {}),
  };
}

/** Last row thread_started: adopt the subagent, write only its turn_started. */
async function adopt(
  rc: RunContext,
  call: string,
  pos: Extract<CallPosition, { kind: "adopt" }>,
  lostClock: Map<string, { sig: string; since: number }>,
): Promise<void> {
  const r = await rc.host.readThread(pos.thread.thread_id);
  if (r.ok) {
    const turn = markerTurn(r.value, pos.step.marker);
    if (turn) {
      rc.append([turnStartedRow(call, pos.step, turn.id)]);
      rc.emit({ type: "bound", call, marker: pos.step.marker, agent: r.value.id, via: "adopt" });
      return;
    }
  }
  if (!r.ok && r.reason === "unreachable") {
    await sleep(rc.pollMs);
    return;
  }
  const status = r.ok ? r.value.status.type : "unknown";
  if (status === "notLoaded" || status === "systemError" || status === "unknown") {
    if (clockRanOut(rc, lostClock, pos.step.marker, status)) {
      await loseAttempt(
        rc,
        call,
        pos.step,
        pos.thread.thread_id,
        null,
        `thread ${status} for LostAfter`,
        status,
        null,
      );
      return;
    }
  }
  await sleep(rc.pollMs);
}

function clockRanOut(
  rc: RunContext,
  clocks: Map<string, { sig: string; since: number }>,
  key: string,
  sig: string,
): boolean {
  const now = Date.now();
  const c = clocks.get(key);
  if (!c || c.sig !== sig) {
    clocks.set(key, { sig, since: now });
    return false;
  }
  return now - c.since >= rc.lostAfterMs;
}

async function loseAttempt(
  rc: RunContext,
  call: string,
  step: Step,
  agent: string,
  turnId: string | null,
  reason: string,
  hostStatus: string,
  turnStatus: string | null,
): Promise<void> {
  rc.append([
    {
      type: "session_attempt_lost",
      call,
      op: step.op,
      attempt: step.attempt,
      agent_id: agent,
      k: step.k,
      turn_id: turnId,
      reason,
      host_status: hostStatus,
      turn_status: turnStatus,
    },
  ]);
  rc.emit({ type: "attempt_lost", call, attempt: step.attempt, reason });
}

async function harvest(
  rc: RunContext,
  call: string,
  fold: CallFold,
  pos: Extract<CallPosition, { kind: "harvest" }>,
  lostClock: Map<string, { sig: string; since: number }>,
): Promise<void> {
  const { step, thread, turn } = pos;
  const intent =
    fold.interrupt && fold.interrupt.k === step.k && fold.interrupt.attempt === step.attempt
      ? fold.interrupt
      : null;
  const r = await rc.host.readThread(thread.thread_id);
  if (!r.ok && r.reason === "unreachable") {
    await sleep(rc.pollMs); // a host that cannot be asked judges nothing
    return;
  }
  const hostThread = r.ok ? r.value : null;
  const t = hostThread?.turns.find((x) => x.id === turn.turn_id) ?? null;
  const threadStatus = hostThread ? hostThread.status.type : "unknown";
  if (intent && t && t.status !== "inProgress") {
    hold(rc, call, step, intent.reason, `the turn ${t.status} after the interrupt`);
    return;
  }
  if (intent && t?.status === "inProgress") {
    await rc.host.interruptTurn(thread.thread_id, turn.turn_id);
    await sleep(rc.pollMs);
    return;
  }
  if (t && hostThread && t.status === "completed") {
    await evaluate(rc, call, step, thread, hostThread, t);
    return;
  }
  if (t && hostThread && (t.status === "failed" || t.status === "interrupted") && t.error) {
    onFailedTurn(rc, call, step, t);
    return;
  }
  const badThread =
    threadStatus === "notLoaded" || threadStatus === "systemError" || threadStatus === "unknown";
  const endedWithoutError = t !== null && (t.status === "failed" || t.status === "interrupted");
  if (badThread || endedWithoutError) {
    const sig = `${threadStatus}:${t?.status ?? "none"}:${t?.items.length ?? 0}`;
    const ranOut = clockRanOut(rc, lostClock, step.marker, sig);
    if ((badThread && endedWithoutError) || ranOut) {
      // the thread is read once more before the attempt is judged lost
      const again = await rc.host.readThread(thread.thread_id);
      if (!again.ok && again.reason === "unreachable") return;
      const t2 = again.ok ? (again.value.turns.find((x) => x.id === turn.turn_id) ?? null) : null;
      const status2 = again.ok ? again.value.status.type : "unknown";
      const stillBad = status2 === "notLoaded" || status2 === "systemError" || status2 === "unknown";
      if (t2?.status === "completed" || (t2?.error ?? null) !== null) return; // harvested next round
      if (!stillBad && t2?.status === "inProgress") return; // it came back: wait for it
      await loseAttempt(
        rc,
        call,
        step,
        thread.thread_id,
        turn.turn_id,
        endedWithoutError ? `turn ${t?.status} without an error` : `no change for ${rc.lostAfterMs} ms`,
        status2,
        t2?.status ?? null,
      );
      return;
    }
  } else {
    lostClock.delete(step.marker);
  }
  await sleep(rc.pollMs);
}

function onFailedTurn(rc: RunContext, call: string, step: Step, t: HostTurn): void {
  const info = t.error?.codexErrorInfo ?? null;
  const message = t.error?.message ?? "";
  if (info && /usage|rate/i.test(info)) {
    hold(rc, call, step, "usage_limit", `${info}: ${message}`);
    rc.append([{ type: "run_paused", reason: "usage_limit", call }]);
    rc.stop("usage_limit");
    return;
  }
  if (info === "contextWindowExceeded") {
    rc.append([
      {
        type: "null_model",
        call,
        op: call,
        reason: "context_window_exceeded",
        tokens: step.call_tokens ?? {},
      },
    ]);
    closeAgent(rc, call);
    return;
  }
  hold(rc, call, step, "host_failure", `${info ?? "failed"}: ${message}`);
  rc.append([{ type: "run_paused", reason: `held:${call}`, call }]);
  rc.stop(`held:${call}`);
}

function hold(rc: RunContext, call: string, step: Step | null, reason: string, detail?: string): void {
  rc.append([
    {
      type: "held",
      call,
      op: call,
      reason,
      ...(detail ? { detail } : {}),
      ...(step?.call_tokens ? { tokens: step.call_tokens } : {}),
    },
  ]);
  rc.emit({ type: "call_ended", call, status: `held (${reason})` });
}

async function evaluate(
  rc: RunContext,
  call: string,
  step: Step,
  thread: RowOf<"thread_started">,
  hostThread: HostThread,
  t: HostTurn,
): Promise<void> {
  const text = answerText(t);
  let cumulative: Tokens | undefined;
  const tc = await rc.host.readTokenCount(hostThread);
  if (tc.ok && tc.value) cumulative = tc.value;
  else {
    rc.append([
      {
        type: "tokens_unmeasured",
        call,
        op: step.op,
        k: step.k,
        turn_id: t.id,
        pauses: false,
        reason: tc.ok ? "the rollout has no token_count yet" : tc.message,
      },
    ]);
  }
  const delta = cumulative ? subtractTokens(cumulative, step.tokens_seen) : {};
  const callTokens = addTokens(step.call_tokens, delta);
  const prepared = foldCall(rc.rowsOf(call)).prepared as RowOf<"prepared">;
  let errors: string[];
  if (text === null) errors = ["the turn ended with no final answer message"];
  else {
    const parsed = parseAnswer(text);
    if (parsed.ok) {
      errors = validateAgainst(prepared.input.schema, parsed.value);
      if (errors.length === 0) {
        rc.append([
          {
            type: "completed",
            call,
            op: call,
            k: step.k,
            attempt: step.attempt,
            result: parsed.value,
            result_digest: digestOf(parsed.value),
            raw_text: text,
            extracted: parsed.extracted,
            tokens: callTokens,
          },
        ]);
        rc.emit({ type: "call_ended", call, status: "completed" });
        closeAgent(rc, call);
        return;
      }
    } else errors = [parsed.error];
  }
  if (step.repair) {
    rc.append([
      {
        type: "null_model",
        call,
        op: call,
        reason: "answer_invalid_after_repair",
        ...(text !== null ? { raw_text: text } : {}),
        errors,
        tokens: callTokens,
      },
    ]);
    rc.emit({ type: "call_ended", call, status: "null_model" });
    closeAgent(rc, call);
    return;
  }
  const open = hostThread.status.type !== "notLoaded" && hostThread.status.type !== "systemError";
  const answer = text ?? "";
  const next: NextStep = open
    ? {
        k: step.k + 1,
        attempt: step.attempt,
        action: "send_input",
        agent_id: thread.thread_id,
        repair: { answer, errors },
        previous_answer: answer,
        tokens_seen: cumulative ? subtractTokens(cumulative, {}) : (step.tokens_seen ?? {}),
        call_tokens: callTokens,
        conversation_turn: 2,
        close: [],
      }
    : {
        k: step.k + 1,
        attempt: step.attempt + 1,
        action: "spawn",
        repair: { answer, errors },
        previous_answer: answer,
        call_tokens: callTokens,
        conversation_turn: 2,
        close: [{ attempt: step.attempt, agent_id: thread.thread_id }],
      };
  const fold = foldCall(rc.rowsOf(call));
  publish(rc, call, fold, next, new Map());
}

/** The subagent is closed once the call has its terminal row: one close file for its newest subagent. */
function closeAgent(rc: RunContext, call: string): void {
  const fold = foldCall(rc.rowsOf(call));
  const last = fold.threads[fold.threads.length - 1];
  if (last && !fold.lostAttempts.includes(last.attempt)) {
    rc.bus.writeClose({
      run_id: rc.runId,
      call,
      attempt: last.attempt,
      action: "close",
      agent_id: last.thread_id,
    });
  }
}

/**
 * A pause, a held call elsewhere or a fatal error stops the call: a running turn is interrupted (the
 * interrupt_requested row is durable before the interrupt is sent) and its thread read until it is no
 * longer active; a step no subagent took is retracted; then the call is held for the reason.
 */
async function stopCall(
  rc: RunContext,
  call: string,
  _fold: CallFold,
  pos: CallPosition,
  files: Map<string, StepFiles>,
): Promise<void> {
  const reason = rc.stopping?.reason ?? "stopped";
  if (pos.kind === "terminal") return;
  if (pos.kind === "publish") {
    const rows = rc.rowsOf(call);
    const last = rows.findLast((r) => r.type !== "run_paused");
    if (last?.type !== "held") hold(rc, call, null, reason);
    return;
  }
  const step = pos.step;
  let agent: string | null = pos.kind === "await_bind" ? (step.agent_id ?? null) : pos.thread.thread_id;
  let turnId: string | null = pos.kind === "harvest" ? pos.turn.turn_id : null;
  if (pos.kind === "await_bind") {
    rc.bus.retractStep(call, step.k, step.attempt);
    closeUnwritten(rc, call, step, files, false);
  }
  if (agent && !turnId) {
    // a known subagent's turn for the step is bound first, so the rows name the turn the interrupt reaches
    const r = await rc.host.readThread(agent);
    const turn = r.ok ? markerTurn(r.value, step.marker) : null;
    if (turn) {
      rc.append([turnStartedRow(call, step, turn.id)]);
      turnId = turn.id;
    } else agent = null;
  }
  if (agent && turnId) {
    const r = await rc.host.readThread(agent);
    const t = r.ok ? r.value.turns.find((x) => x.id === turnId) : undefined;
    if (t?.status === "inProgress") {
      rc.append([
        {
          type: "interrupt_requested",
          call,
          op: step.op,
          reason,
          k: step.k,
          attempt: step.attempt,
          turn_id: turnId,
        },
      ]);
      await rc.host.interruptTurn(agent, turnId);
      const deadline = Date.now() + rc.lostAfterMs;
      while (Date.now() < deadline) {
        const again = await rc.host.readThread(agent);
        if (!again.ok) break;
        const t2 = again.value.turns.find((x) => x.id === turnId);
        if (again.value.status.type !== "active" && t2?.status !== "inProgress") break;
        await sleep(rc.pollMs);
      }
    }
  }
  hold(rc, call, step, reason);
}
