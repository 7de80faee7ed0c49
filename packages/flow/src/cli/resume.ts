import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { launchRunProcess } from "../run/launch.js";
import { lockHolder } from "../run/locks.js";
import { runPaths, stateDirFrom } from "../run/paths.js";
import { readRunState } from "../run/runState.js";
import { type RunSpec, readSpec } from "../run/spec.js";
import { EXIT_OK, EXIT_REFUSED, FlowError } from "../util/errors.js";
import { parseCommand, print } from "./args.js";

/**
 * `crw flow resume RUN [SCRIPT] [--detach]`: goes on with a run no process holds, on the backend its
 * started row records. In the foreground the run runs in this process (exit 2 for a mixed backend, an op
 * whose input changed, or an unusable recorded TMPDIR); --detach starts its process and returns. SCRIPT
 * is another copy or version of the run's workflow module (the same workflow name): this process runs it,
 * and so do the run's later processes (its started row names it). Its calls must come out as the
 * journal's, or the resume is refused naming the op.
 */
export async function resumeCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseCommand(
    "resume",
    args,
    { state: { type: "string" }, detach: { type: "boolean" } },
    ["RUN"],
    ["SCRIPT"],
  );
  const paths = runPaths(stateDirFrom(values.state), positionals[0] as string);
  const spec = readSpec(paths.spec);
  const workflowPath = positionals[1] ? await checkedScript(positionals[1], spec) : undefined;
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
    const pid = launchRunProcess(paths, spec, process.env, workflowPath);
    print(
      values.json,
      { run_id: spec.run_id, resumed_pid: pid },
      `run ${spec.run_id} resumed (pid ${pid}); take its steps with: crw flow next ${spec.run_id} --json`,
    );
    return EXIT_OK;
  }
  const { holdRun } = await import("./runProcess.js");
  return holdRun({ paths, spec, ...(workflowPath ? { workflowPath } : {}) });
}

/** SCRIPT as an absolute path, once it loads as a workflow of the run's name (else an input error, exit 2). */
async function checkedScript(script: string, spec: RunSpec): Promise<string> {
  const path = resolve(script);
  if (!existsSync(path)) throw new FlowError("workflow_invalid", `workflow module ${path} does not exist`, 2);
  const { loadWorkflow } = await import("../engine/workflow.js");
  const workflow = await loadWorkflow(path);
  if (workflow.name !== spec.workflow_name) {
    throw new FlowError(
      "workflow_invalid",
      `${path} is workflow '${workflow.name}'; run ${spec.run_id} runs '${spec.workflow_name}'`,
      2,
    );
  }
  return path;
}
