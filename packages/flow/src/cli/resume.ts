import { launchRunProcess } from "../run/launch.js";
import { lockHolder } from "../run/locks.js";
import { runPaths, stateDirFrom } from "../run/paths.js";
import { readRunState } from "../run/runState.js";
import { readSpec } from "../run/spec.js";
import { EXIT_OK, EXIT_REFUSED } from "../util/errors.js";
import { parseCommand, print } from "./args.js";

/**
 * `crw flow resume RUN [--detach]`: goes on with a run no process holds, on the backend its started row
 * records. In the foreground the run runs in this process (exit 2 for a mixed backend, an op whose
 * input changed, or an unusable recorded TMPDIR); --detach starts its process and returns.
 */
export async function resumeCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseCommand(
    "resume",
    args,
    { state: { type: "string" }, detach: { type: "boolean" } },
    ["RUN"],
  );
  const paths = runPaths(stateDirFrom(values.state), positionals[0] as string);
  const spec = readSpec(paths.spec);
  const state = readRunState(paths, false);
  if (state.kind === "ended") {
    print(
      values.json,
      { run_id: spec.run_id, state: "ended", status: state.endedStatus },
      `run ${spec.run_id} has ended (${state.endedStatus}); nothing to resume`,
    );
    return EXIT_OK;
  }
  if (lockHolder(paths.runLock) || lockHolder(paths.startLock)) {
    const msg = `run ${spec.run_id} is live (a process holds it); nothing resumed`;
    print(values.json, { run_id: spec.run_id, state: "live", warning: msg }, `warning: ${msg}`);
    return EXIT_REFUSED;
  }
  if (values.detach) {
    const pid = launchRunProcess(paths, spec);
    print(
      values.json,
      { run_id: spec.run_id, resumed_pid: pid },
      `run ${spec.run_id} resumed (pid ${pid}); take its steps with: crw flow next ${spec.run_id} --json`,
    );
    return EXIT_OK;
  }
  const { holdRun } = await import("./runProcess.js");
  return holdRun({ paths, spec });
}
