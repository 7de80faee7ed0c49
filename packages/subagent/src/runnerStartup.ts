import { type ChildProcess, fork } from "node:child_process";
import { randomUUID } from "node:crypto";
import { RunnerStartupCancelledError, RunnerStartupError, toError } from "./errors.js";
import { HEARTBEAT_INTERVAL_MS } from "./heartbeat.js";
import { type OutputFrameOf, parseOutputFrame } from "./protocol/index.js";
import type { InputFrame } from "./protocol/input.js";
import type { RetryPolicy } from "./protocol/policy.js";
import { runnerExecArgv } from "./runnerEntry.js";
import type { SubagentRunnerHost } from "./runnerHost.js";
import { RUNNER_BOOT_TIMEOUT_MS, type SubagentRunnerHostDeps } from "./runnerHostTypes.js";

export type Exit = { code: number | null; signal: NodeJS.Signals | null };

/**
 * One physical attempt: fork, hello (build identity compared), boot (policy and catalog), boot reply, all
 * under one deadline. The policy subscription is taken before the initial read so a revision committed
 * while the read is in flight is not lost; the newer of the two is what boot carries.
 */
export function startRunnerHost(
  deps: SubagentRunnerHostDeps,
  build: (
    child: ChildProcess,
    policy: RetryPolicy,
    unsubscribe: () => void,
    exited: Promise<Exit>,
    bootRevision: number,
  ) => SubagentRunnerHost,
): Promise<SubagentRunnerHost> {
  if (deps.isCurrent && !deps.isCurrent()) {
    return Promise.reject(new RunnerStartupCancelledError("runner startup belongs to a replaced lifetime"));
  }
  let newest: RetryPolicy | undefined;
  let bootPolicy: RetryPolicy | undefined;
  let host: SubagentRunnerHost | undefined;
  const unsubscribe = deps.retryPolicySource.subscribe((p) => {
    if (!newest || p.revision > newest.revision) newest = p;
    host?.policyChanged(p);
  });
  let child: ChildProcess;
  try {
    child = fork(deps.entry, [], {
      execArgv: runnerExecArgv(deps.entry, deps.execArgv ?? process.execArgv),
      ...(deps.execPath && { execPath: deps.execPath }),
      env: { ...process.env, ...deps.env },
      stdio: ["ignore", "ignore", "pipe", "ipc"],
      serialization: "json",
    });
  } catch (e) {
    unsubscribe();
    return Promise.reject(
      new RunnerStartupError("fork_failed", "could not fork a sub-agent runner", { cause: e }),
    );
  }
  const exited = new Promise<Exit>((resolve) => {
    child.once("exit", (code, signal) => resolve({ code, signal }));
    child.once("error", () => {
      // A spawn error emits no exit when the process never started.
      if (child.pid === undefined) resolve({ code: null, signal: null });
    });
  });
  let buffered = "";
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", (chunk: string) => {
    buffered += chunk;
    let nl = buffered.indexOf("\n");
    while (nl >= 0) {
      deps.onEvent?.({ type: "stderr", runnerId: deps.runnerId, line: buffered.slice(0, nl) });
      buffered = buffered.slice(nl + 1);
      nl = buffered.indexOf("\n");
    }
  });

  return new Promise<SubagentRunnerHost>((resolve, reject) => {
    let settled = false;
    const bootRequestId = randomUUID();
    const fail = (error: Error) => {
      if (settled) return;
      settled = true;
      clearTimeout(deadline);
      child.off("message", onMessage);
      unsubscribe();
      if (child.exitCode === null && child.signalCode === null && child.pid !== undefined)
        child.kill("SIGKILL");
      reject(error);
    };
    const deadline = setTimeout(
      () => fail(new RunnerStartupError("boot_timeout", "sub-agent runner did not become ready in time")),
      deps.bootTimeoutMs ?? RUNNER_BOOT_TIMEOUT_MS,
    );
    child.once("error", (e) => {
      if (child.pid === undefined)
        fail(new RunnerStartupError("fork_failed", "could not fork a sub-agent runner", { cause: e }));
    });
    exited.then((exit) =>
      fail(
        new RunnerStartupError(
          "boot_failed",
          `sub-agent runner exited during startup (code ${exit.code ?? "none"})`,
        ),
      ),
    );
    const onMessage = (raw: unknown) => {
      const parsed = parseOutputFrame(raw);
      if (!parsed.ok)
        return deps.onEvent?.({ type: "frame_refused", runnerId: deps.runnerId, issues: parsed.issues });
      const frame = parsed.frame;
      if (frame.type === "hello") return void onHello(frame);
      if (frame.type === "bootReply" && frame.requestId === bootRequestId) return onBootReply(frame);
      deps.onEvent?.({
        type: "frame_refused",
        runnerId: deps.runnerId,
        issues: `${frame.type} during handshake`,
      });
    };
    const onHello = async (frame: OutputFrameOf<"hello">) => {
      if (frame.buildId !== deps.buildId) {
        return fail(
          new RunnerStartupError("build_mismatch", "sub-agent runner build differs from the daemon build"),
        );
      }
      let policy: RetryPolicy;
      try {
        const read = await deps.retryPolicySource.read();
        policy = newest && newest.revision > read.revision ? newest : read;
      } catch (e) {
        // Not an availability failure: an unexpected error propagates unchanged.
        return fail(toError(e));
      }
      if (settled) return;
      bootPolicy = policy;
      child.send(
        {
          type: "boot",
          requestId: bootRequestId,
          runnerId: deps.runnerId,
          buildId: deps.buildId,
          retryPolicy: policy,
          catalog: deps.catalog,
          heartbeatIntervalMs: deps.heartbeatIntervalMs ?? HEARTBEAT_INTERVAL_MS,
          ...(deps.agentOptions && { agent: deps.agentOptions }),
        } satisfies InputFrame,
        () => {},
      );
    };
    const onBootReply = (frame: OutputFrameOf<"bootReply">) => {
      if ("error" in frame.result) {
        const category = frame.result.error.code === "build_mismatch" ? "build_mismatch" : "boot_failed";
        return fail(
          new RunnerStartupError(category, `sub-agent runner refused boot (${frame.result.error.code})`),
        );
      }
      if (deps.isCurrent && !deps.isCurrent()) {
        return fail(new RunnerStartupCancelledError("runner became ready for a replaced lifetime"));
      }
      settled = true;
      clearTimeout(deadline);
      child.off("message", onMessage);
      const booted = bootPolicy as RetryPolicy;
      host = build(child, booted, unsubscribe, exited, frame.result.ok.policyRevision);
      // A revision committed between boot and ready is forwarded now.
      if (newest && newest.revision > booted.revision) host.policyChanged(newest);
      resolve(host);
    };
    child.on("message", onMessage);
  });
}
