import type { NewRow, RowOf } from "../journal/rows.js";
import { markerOf, sendInputMessage, spawnMessage } from "../steps/message.js";
import { buildPacket, repairInput } from "../steps/packet.js";
import { packetPath } from "../steps/stepBus.js";
import { sha256 } from "../util/canonical.js";
import type { CallFold, NextStep } from "./callFold.js";
import { continuationSection } from "./continuation.js";
import { isGated, stepEvidence } from "./evidence.js";
import type { RunContext } from "./runContext.js";

export type Step = RowOf<"step_published">;

/** In-memory bookkeeping of one step's files; a resumed process starts it unwritten (it writes them again). */
export interface StepFiles {
  written: boolean;
  /** When this process began to wait for the step (0 for a step a resumed process found waiting). */
  since: number;
  failures: number;
  firstAt: string | null;
  lastAt: string | null;
  warned: boolean;
  lastError: string;
}

export async function publish(
  rc: RunContext,
  call: string,
  fold: CallFold,
  next: NextStep,
  files: Map<string, StepFiles>,
): Promise<void> {
  const prepared = fold.prepared as RowOf<"prepared">;
  // a lost or held attempt's subagent (off the per-call path): closed in the same turn as its row is read
  for (const c of next.close) {
    rc.bus.writeClose({ run_id: rc.runId, call, attempt: c.attempt, action: "close", agent_id: c.agent_id });
  }
  const role = prepared.role;
  const entry = rc.table.roles[role];
  const pair = rc.pins[role];
  const marker = markerOf(call, next.k, next.attempt);
  const packet = packetPath(rc.paths.steps, call, next.k, next.attempt);
  const workspace = prepared.allocation.workspace;
  const packetText = packetTextOf(rc, fold, {
    marker,
    workspace,
    ...(next.note ? { note: next.note } : {}),
    ...(next.repair ? { repair: next.repair } : {}),
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
    // a continuation's explicit effort (checked when the call was made) is the one the step asks for
    effort: pair.effort ?? prepared.input.effort ?? null,
    workspace,
    ...(next.action === "send_input" && next.agent_id ? { agent_id: next.agent_id } : {}),
    ...(next.note ? { note: next.note } : {}),
    ...(next.previous_answer !== undefined ? { previous_answer: next.previous_answer } : {}),
    ...(next.repair ? { repair: next.repair } : {}),
    ...(next.tokens_seen ? { tokens_seen: next.tokens_seen } : {}),
    ...(next.call_tokens ? { call_tokens: next.call_tokens } : {}),
    conversation_turn: next.conversation_turn,
    ...(next.replaces_turn !== undefined ? { replaces_turn: next.replaces_turn } : {}),
    // a spawn step of a gated executor role in a run with an evidence cwd names its flow evidence record
    ...(next.action === "spawn" && rc.spec.evidence && isGated(role)
      ? stepEvidence(rc.runId, call, rc.rowsOf(call))
      : {}),
  };
  const [written] = await rc.appendDurable([row]);
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
  await writeStepFiles(rc, written as Step, packetText, state);
}

export function packetTextOf(
  rc: RunContext,
  fold: CallFold,
  step: Pick<Step, "marker" | "workspace" | "note" | "repair">,
): string {
  const prepared = fold.prepared as RowOf<"prepared">;
  const earlier: string[] = [];
  if (step.note) earlier.push(step.note);
  if (step.note && prepared.role.startsWith("executor")) {
    earlier.push(
      `Read git -C ${step.workspace} status and the diff first: the previous attempt may have changed files.`,
    );
  }
  const text = buildPacket({
    marker: step.marker,
    role: prepared.role,
    workspace: step.workspace,
    overlay: rc.table.roles[prepared.role].overlay,
    tmpdir: rc.spec.env ? { dir: rc.spec.env.TMPDIR, specPath: rc.paths.spec } : null,
    goRoot: rc.table.verifier
      ? { dir: rc.table.verifier.go_root, source: rc.table.source ?? "role store" }
      : null,
    earlierAttempts: earlier,
    task: prepared.input.task,
    repair: step.repair ?? null,
    schema: prepared.input.schema,
  });
  return prepared.input.resume ? `${text}\n${continuationSection(rc, prepared)}` : text;
}

/** Writes a step's packet and file; a failure is recorded at the 1st, 10th, 100th … failure. */
export async function writeStepFiles(
  rc: RunContext,
  step: Step,
  packetText: string,
  state: StepFiles,
): Promise<void> {
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
export function closeUnwritten(
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
