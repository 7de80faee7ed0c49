import { noteHostNotification } from "../backends/appServerTokens.js";
import type { SessionHost } from "../host/sessionHost.js";
import { type LockInfo, newToken, tryLock, unlock } from "../run/locks.js";
import { processLockPath, type RunPaths, runPaths, stateDirFrom } from "../run/paths.js";
import { type RunSpec, readSpec } from "../run/spec.js";
import { unusable } from "../run/tmploc.js";
import { EXIT_INPUT, EXIT_OK, EXIT_REFUSED, FlowError } from "../util/errors.js";
import { removeIfExists } from "../util/fsx.js";
import { parseCommand } from "./args.js";

export interface HoldRunOptions {
  paths: RunPaths;
  spec: RunSpec;
  /** The host to use; by default the app-server adapter over the spec's transport. */
  host?: SessionHost;
  log?: (line: Record<string, unknown>) => void;
  /** The process lock's token (a fresh random one by default). */
  token?: string;
  /** The workflow module to run instead of the run's own (`crw flow resume RUN SCRIPT`). */
  workflowPath?: string;
}

/**
 * Runs a run in this process (the detached `crw flow _run` and the foreground `crw flow resume RUN`):
 * the spec's env goes into this process's environment before any lock (and is put back after), the
 * process lock is taken before the run lock and let go after it, and the run executes under both.
 */
export async function holdRun(opts: HoldRunOptions): Promise<number> {
  const { spec } = opts;
  const log =
    opts.log ??
    ((line) => process.stderr.write(`${JSON.stringify({ at: new Date().toISOString(), ...line })}\n`));
  const saved = process.env.TMPDIR;
  if (spec.env) {
    const problem = unusable(spec.env.TMPDIR);
    if (problem)
      throw new FlowError(
        "run_env_unusable",
        `the run's recorded ${problem}; make the directory again`,
        EXIT_INPUT,
      );
    process.env.TMPDIR = spec.env.TMPDIR;
  }
  // A promise the workflow's own code leaves rejected and unawaited must not kill the process that holds
  // the run (its rows would stop mid-way and its locks stay behind): it is logged, the run goes on.
  const onUnhandled = (reason: unknown) =>
    log({
      msg: "unhandled rejection in the run process (the workflow left a promise unawaited)",
      error: reason instanceof Error ? reason.message : String(reason),
    });
  process.on("unhandledRejection", onUnhandled);
  try {
    return await holdRunGuarded(opts, log);
  } finally {
    process.off("unhandledRejection", onUnhandled);
    if (spec.env) {
      if (saved === undefined) delete process.env.TMPDIR;
      else process.env.TMPDIR = saved;
    }
  }
}

async function holdRunGuarded(
  opts: HoldRunOptions,
  log: (line: Record<string, unknown>) => void,
): Promise<number> {
  const { paths, spec } = opts;
  const token = opts.token ?? newToken();
  const processLock = processLockPath(paths, token);
  let heldToken: string | null = token;
  try {
    if (!tryLock(processLock, { pid: process.pid, token })) {
      log({ msg: "process lock not taken; the started row names no process", lock: processLock });
      heldToken = null;
    }
    const me: LockInfo = heldToken ? { pid: process.pid, token } : { pid: process.pid };
    if (!tryLock(paths.runLock, me)) {
      log({ msg: "the run is live: another process holds its run lock; nothing done" });
      return EXIT_REFUSED;
    }
    let host = opts.host;
    let ownHost = false;
    try {
      if (!host && spec.backend !== "local") {
        const { createAppServerHost } = await import("../host/index.js");
        host = createAppServerHost({
          transport: spec.host,
          onEvent: (e) => {
            if (e.type === "config_warning") log({ msg: "host config warning", summary: e.summary });
            if (e.type === "notification") noteHostNotification(e.notification);
          },
        });
        ownHost = true;
      }
      const { executeRun } = await import("../engine/executeRun.js");
      const outcome = await executeRun({
        paths,
        spec,
        host,
        processToken: heldToken,
        ...(opts.workflowPath ? { workflowPath: opts.workflowPath } : {}),
        onEvent: (event) => log({ msg: "event", ...event }),
      });
      log({ msg: "run process ends", ...outcome });
      return outcome.state === "failed" ? EXIT_REFUSED : EXIT_OK;
    } finally {
      if (ownHost) await host?.close();
      unlock(paths.runLock);
    }
  } finally {
    if (heldToken) removeIfExists(processLock);
  }
}

export async function runProcessCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseCommand(
    "_run",
    args,
    { state: { type: "string" }, workflow: { type: "string" } },
    ["RUN"],
  );
  const paths = runPaths(stateDirFrom(values.state), positionals[0] as string);
  const spec = readSpec(paths.spec);
  return holdRun({ paths, spec, ...(values.workflow ? { workflowPath: values.workflow } : {}) });
}
