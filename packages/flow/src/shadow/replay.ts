import { parseAnswer, validateAgainst } from "../engine/answer.js";
import { callRows } from "../engine/callFold.js";
import { startedBackend } from "../engine/flowRun.js";
import { type CallOptions, callFailed, callInput, normalizeCall, type Workflow } from "../engine/workflow.js";
import { traceWarnings } from "../git/trace.js";
import type { JournalRow, RowOf } from "../journal/rows.js";
import { WRITING_ROLES } from "../run/roles.js";
import { digestOf } from "../util/canonical.js";

/** One difference between what the journal recorded and what the replay of the workflow does with it. */
export interface Divergence {
  kind:
    | "op_not_in_journal"
    | "input_digest_differs"
    | "result_digest_differs"
    | "answer_differs"
    | "op_not_replayed"
    | "run_result_differs"
    | "run_status_differs"
    | "trace_warnings_differ";
  op: string | null;
  detail: string;
}

export interface ShadowReport {
  run_id: string;
  /** The backend the run's started row records (a started row with none is app-server); null: no started row. */
  backend: "session" | "app-server" | "local" | null;
  /**
   * How the run ended in its journal: completed, failed, cancelled, or running when it has no run_ended
   * row. A cancelled run was stopped from outside the workflow: its replay's end is not compared.
   */
  recorded: "completed" | "failed" | "cancelled" | "running";
  /** How the replay ended: the workflow returned, threw, or stopped at a call the journal has not finished. */
  replay: "completed" | "failed" | "incomplete";
  ops_replayed: number;
  ops_recorded: number;
  /** Calls whose recorded Trace digests (bind and harvest) were judged again. */
  trace_calls_replayed: number;
  divergences: Divergence[];
}

/** The replay stops at a call the journal has no answer for (unfinished, or a divergence that blocks it). */
class ReplayStop extends Error {
  constructor(readonly op: string) {
    super(`replay stopped at ${op}`);
  }
}

/**
 * Replays a run from its journal alone, without any host: the workflow runs again and every call is
 * answered from its terminal row. Each answer is checked the way the run checked it (the recorded raw text
 * parsed and validated again must give the recorded result), each op's input digest against the journal's,
 * the workflow's outcome against run_ended, and every recorded op must be asked for again.
 */
export async function shadowReplay(
  runId: string,
  workflow: Workflow,
  input: unknown,
  rows: readonly JournalRow[],
): Promise<ShadowReport> {
  const divergences: Divergence[] = [];
  const prepared = new Map<string, RowOf<"prepared">>();
  for (const r of rows) if (r.type === "prepared") prepared.set(r.call, r);
  const asked = new Set<string>();
  const counters = new Map<string, number>();
  const callWithWork = async (options: CallOptions) => {
    const n = normalizeCall(options);
    const i = (counters.get(n.node) ?? 0) + 1;
    counters.set(n.node, i);
    const op = `${n.node}.${i}`;
    asked.add(op);
    // the input as the run digested it: a continuation keeps its handle's thread chain from the journal
    const digest = digestOf(
      callInput(n, n.resume ? { call: n.resume, chain: chainOf(rows, n.resume) } : undefined),
    );
    const p = prepared.get(op);
    if (!p) {
      divergences.push({
        kind: "op_not_in_journal",
        op,
        detail: "the replay asks for a call the run never made",
      });
      throw new ReplayStop(op);
    }
    if (p.input_digest !== digest) {
      divergences.push({
        kind: "input_digest_differs",
        op,
        detail: `journal ${p.input_digest}, replay ${digest}`,
      });
      throw new ReplayStop(op);
    }
    const own = callRows(rows, op);
    const terminal = own.findLast((r) => r.type === "completed" || r.type === "null_model");
    if (!terminal) throw new ReplayStop(op);
    if (terminal.type === "null_model") throw callFailed(terminal);
    if (digestOf(terminal.result) !== terminal.result_digest) {
      divergences.push({
        kind: "result_digest_differs",
        op,
        detail: "the recorded result does not match its digest",
      });
    }
    const parsed = parseAnswer(terminal.raw_text);
    const again =
      parsed.ok && validateAgainst(p.input.schema, parsed.value).length === 0 ? parsed.value : null;
    if (again === null || digestOf(again) !== digestOf(terminal.result)) {
      divergences.push({
        kind: "answer_differs",
        op,
        detail: parsed.ok ? "the recorded answer, read again, is not the recorded result" : parsed.error,
      });
    }
    return { op, answer: terminal.result, work: terminal.work ?? null };
  };
  const call = async (options: CallOptions): Promise<unknown> => (await callWithWork(options)).answer;
  let replay: ShadowReport["replay"];
  let outcome: unknown;
  try {
    const decide = async (o: { id: string }): Promise<string> => {
      const answered = rows.find((r) => r.type === "decision_answered" && r.decision === o.id);
      if (answered?.type !== "decision_answered") throw new ReplayStop(`decision ${o.id}`);
      return answered.answer;
    };
    outcome = await workflow.run(
      { runId, call: call as never, callWithWork: callWithWork as never, decide },
      input,
    );
    replay = "completed";
  } catch (e) {
    replay = e instanceof ReplayStop ? "incomplete" : "failed";
  }
  const ended = rows.findLast((r) => r.type === "run_ended");
  const recorded = ended?.type === "run_ended" ? ended.status : "running";
  if (replay !== "incomplete" && recorded !== "running" && recorded !== "cancelled") {
    if (replay !== recorded) {
      divergences.push({
        kind: "run_status_differs",
        op: null,
        detail: `journal ${recorded}, replay ${replay}`,
      });
    } else if (
      recorded === "completed" &&
      ended?.type === "run_ended" &&
      digestOf(outcome) !== digestOf(ended.result)
    ) {
      divergences.push({
        kind: "run_result_differs",
        op: null,
        detail: "the workflow returns another result",
      });
    }
  }
  if (replay !== "incomplete") {
    for (const op of prepared.keys()) {
      if (!asked.has(op)) {
        divergences.push({
          kind: "op_not_replayed",
          op,
          detail: "the run made this call; the replay never asks for it",
        });
      }
    }
  }
  const trace = replayTrace(rows, prepared);
  divergences.push(...trace.divergences);
  return {
    run_id: runId,
    backend: startedBackend(rows),
    recorded,
    replay,
    ops_replayed: asked.size,
    ops_recorded: prepared.size,
    trace_calls_replayed: trace.calls,
    divergences,
  };
}

/** A handle's thread chain as the run recorded it: its own continued chain first, then its subagents. */
function chainOf(rows: readonly JournalRow[], handle: string): string[] {
  const own = callRows(rows, handle);
  const p = own.find((r): r is RowOf<"prepared"> => r.type === "prepared");
  const threads = own.filter((r): r is RowOf<"thread_started"> => r.type === "thread_started");
  return [...(p?.input.resume?.chain ?? []), ...threads.map((t) => t.thread_id)];
}

const TRACE_WARNINGS = new Set(["read_role_wrote", "executor_wrote_outside", "shared_state_changed"]);

/**
 * The Trace digests replayed: for every call with a bind and a harvest trace_digests row, the warnings are
 * judged again from those digests and the role (the same rule the run applied) and compared with the
 * flow_warning rows the run wrote for the call. A journal without digest rows (a run without Trace, or
 * written before they were recorded) has nothing to replay.
 */
function replayTrace(
  rows: readonly JournalRow[],
  prepared: ReadonlyMap<string, RowOf<"prepared">>,
): { calls: number; divergences: Divergence[] } {
  const divergences: Divergence[] = [];
  let calls = 0;
  for (const [call, p] of prepared) {
    const own = callRows(rows, call);
    const digests = own.filter((r): r is RowOf<"trace_digests"> => r.type === "trace_digests");
    const harvest = digests.findLast((d) => d.point === "harvest");
    const bind = harvest && digests.findLast((d) => d.point === "bind" && d.seq < harvest.seq);
    if (!harvest || !bind) continue;
    calls++;
    const expected = traceWarnings({
      writes: WRITING_ROLES.has(p.role),
      atBind: bind.digests,
      atHarvest: harvest.digests,
    })
      .map((w) => `${w.warning}:${[...w.changed].sort().join(",")}`)
      .sort();
    const recorded = own
      .filter(
        (r): r is RowOf<"flow_warning"> =>
          r.type === "flow_warning" && TRACE_WARNINGS.has(r.warning) && r.seq > harvest.seq,
      )
      .map((r) => `${r.warning}:${[...((r.detail?.changed as string[]) ?? [])].sort().join(",")}`)
      .sort();
    if (JSON.stringify(expected) !== JSON.stringify(recorded)) {
      divergences.push({
        kind: "trace_warnings_differ",
        op: call,
        detail: `the recorded digests give [${expected.join(" ")}]; the run recorded [${recorded.join(" ")}]`,
      });
    }
  }
  return { calls, divergences };
}
