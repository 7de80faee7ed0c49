import { writeCancelRequest } from "../run/cancelRequest.js";
import { launchRunProcess } from "../run/launch.js";
import { type RunPaths, runPaths, stateDirFrom } from "../run/paths.js";
import { type RunState, readRunState } from "../run/runState.js";
import { readSpec } from "../run/spec.js";
import { EXIT_OK, EXIT_REFUSED, FlowError } from "../util/errors.js";
import { numberOption, parseCommand, print } from "./args.js";
import { RunWatch } from "./runWatch.js";

const DEFAULT_REASON = "cancelled with crw flow cancel";
const DEFAULT_WAIT_S = 30;
/** The bound of each wait for the run's end: the watch of the run's directory ends it sooner. */
const POLL_MS = 200;

/**
 * `crw flow cancel RUN [--reason TEXT] [--wait S]`: ends a run that has not ended. The request is made
 * durable in the run's inbox and the run's process takes it: it journals the request, stops every call
 * (a running subagent turn is interrupted and read until it runs no more, a step no subagent took is
 * retracted, the call is held), hands the owner close steps for the subagents it leaves, and ends the run
 * cancelled. A run no process holds (paused, or its process gone) gets a process to do that. The command
 * waits up to S seconds (default 30) for the end: exit 0 once the run has ended cancelled (or with
 * --wait 0, once the request is made), 1 when the run had ended otherwise or is still stopping its calls.
 */
export async function cancelCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseCommand(
    "cancel",
    args,
    { state: { type: "string" }, reason: { type: "string" }, wait: { type: "string" } },
    ["RUN"],
  );
  const reason = values.reason ?? DEFAULT_REASON;
  if (reason.trim() === "" || reason.length > 1000)
    throw new FlowError("input", "--reason must be a text of 1 to 1000 characters", 2);
  const waitMs = numberOption("wait", values.wait, DEFAULT_WAIT_S) * 1000;
  const paths = runPaths(stateDirFrom(values.state), positionals[0] as string);
  const spec = readSpec(paths.spec);
  const before = readRunState(paths, false);
  if (before.kind === "ended") return answerEnded(values.json, spec.run_id, before, null, true);
  writeCancelRequest(paths, reason);
  const resumedPid =
    before.kind === "paused" || before.kind === "unheld" ? launchRunProcess(paths, spec) : null;
  const after = await untilEnded(paths, waitMs);
  if (after.kind === "ended") return answerEnded(values.json, spec.run_id, after, resumedPid, false);
  const holder = after.holderPid ?? resumedPid;
  print(
    values.json,
    { run_id: spec.run_id, state: "cancelling", reason, resumed_pid: resumedPid, holder_pid: holder },
    waitMs === 0
      ? `run ${spec.run_id}: cancel requested; its process ends it cancelled (see crw flow show ${spec.run_id})`
      : `run ${spec.run_id}: cancel requested, and its process (pid ${holder ?? "starting"}) is still stopping its calls after ${waitMs / 1000} s; it ends the run cancelled (see crw flow show ${spec.run_id})`,
  );
  return waitMs === 0 ? EXIT_OK : EXIT_REFUSED;
}

/** Reads the run's state until it has ended or `waitMs` passed (woken by changes of the run's directory). */
async function untilEnded(paths: RunPaths, waitMs: number): Promise<RunState> {
  const watch = new RunWatch(paths);
  try {
    const t0 = Date.now();
    for (;;) {
      const since = watch.version;
      const state = readRunState(paths, false);
      const left = waitMs - (Date.now() - t0);
      if (state.kind === "ended" || left <= 0) return state;
      await watch.wait(since, Math.min(left, POLL_MS));
    }
  } finally {
    watch.close();
  }
}

function answerEnded(
  json: boolean | undefined,
  runId: string,
  state: RunState,
  resumedPid: number | null,
  already: boolean,
): number {
  const ended = state.view.ended;
  const status = state.endedStatus ?? "ended";
  if (status === "cancelled") {
    const reason = typeof ended?.reason === "string" ? ended.reason : null;
    print(
      json,
      { run_id: runId, state: "ended", status, reason, resumed_pid: resumedPid },
      `run ${runId} ${already ? "was already" : "is"} cancelled${reason ? ` (${reason})` : ""}`,
    );
    return EXIT_OK;
  }
  print(
    json,
    { run_id: runId, state: "ended", status, resumed_pid: resumedPid },
    already
      ? `run ${runId} has ended (${status}); nothing to cancel`
      : `run ${runId} ended ${status} before the cancel took effect`,
  );
  return EXIT_REFUSED;
}
