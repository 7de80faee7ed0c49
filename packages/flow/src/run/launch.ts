import { spawn } from "node:child_process";
import { closeSync, openSync } from "node:fs";
import { FlowError } from "../util/errors.js";
import type { RunPaths } from "./paths.js";
import type { RunSpec } from "./spec.js";
import { unusable } from "./tmploc.js";

/**
 * The CLI entry that starts the run's process: found from the running process (the script node runs,
 * the built `crw` bin or its dist), never by PATH. CRW_CLI_ENTRY overrides it for a harness that runs the
 * CLI some other way.
 */
export function cliEntry(env: NodeJS.ProcessEnv = process.env): string {
  const entry = env.CRW_CLI_ENTRY || process.argv[1];
  if (!entry) throw new FlowError("input", "cannot tell which crw CLI runs this process", 2);
  return entry;
}

/** The environment of a detached launch: the caller's, with the spec's env entries in place (one each). */
export function launchEnv(spec: RunSpec, env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = { ...env };
  if (spec.env) out.TMPDIR = spec.env.TMPDIR;
  return out;
}

/** Why the recorded TMPDIR cannot be used (missing, not a directory, not writable), or null. */
export function recordedTmpdirProblem(spec: RunSpec): string | null {
  return spec.env ? unusable(spec.env.TMPDIR) : null;
}

/**
 * Starts `crw flow _run RUN --state DIR` detached (with `--workflow FILE` when a resume names another
 * module); its output goes to the run's process.log.
 */
export function launchRunProcess(
  paths: RunPaths,
  spec: RunSpec,
  env: NodeJS.ProcessEnv = process.env,
  workflowPath?: string,
): number {
  const problem = recordedTmpdirProblem(spec);
  if (problem)
    throw new FlowError("run_env_unusable", `the run's recorded ${problem}; make the directory again`, 1);
  const log = openSync(paths.log, "a");
  try {
    const child = spawn(
      process.execPath,
      [
        cliEntry(env),
        "flow",
        "_run",
        paths.runId,
        "--state",
        paths.state,
        ...(workflowPath ? ["--workflow", workflowPath] : []),
      ],
      {
        detached: true,
        stdio: ["ignore", log, log],
        env: launchEnv(spec, env),
      },
    );
    // A fork that fails after it was made (EAGAIN) is reported by the missing pid below, not by a crash.
    child.once("error", () => {});
    child.unref();
    if (!child.pid) throw new FlowError("input", "the run's process did not start", 1);
    return child.pid;
  } finally {
    closeSync(log);
  }
}
