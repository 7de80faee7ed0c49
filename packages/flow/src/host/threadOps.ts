import type { z } from "zod";
import { toHostThread } from "./mapThread.js";
import type { HostThread } from "./sessionHost.js";
import { HostSpecError } from "./transport/fromSpec.js";
import type { ThreadResumeParams, ThreadStartParams, threadStartResponseWire } from "./wire.js";

/**
 * Thread operations of the app-server backend (the engine opens a Codex thread per call and runs its
 * turns): thread/start, thread/resume and thread/fork with the run's environment entries as the leaf
 * config keys `shell_environment_policy.set.<NAME>` (Codex applies them key by key over the server's own
 * policy), and the model and reasoning effort of the call's pair. A thread resumed after an app-server
 * restart gets the entries again: the server rebuilds it from its own configuration.
 */
export interface ThreadOptions {
  cwd?: string;
  model?: string | null;
  reasoningEffort?: string | null;
  /** Environment entries for the thread's shell commands. */
  env?: Record<string, string>;
}

const envName = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** The `config` member carrying the pair's effort and the environment entries. */
export function threadConfig(options: ThreadOptions): Record<string, string> | null {
  const config: Record<string, string> = {};
  if (options.reasoningEffort) config.model_reasoning_effort = options.reasoningEffort;
  for (const [name, value] of Object.entries(options.env ?? {})) {
    if (!envName.test(name))
      throw new HostSpecError(`environment entry name '${name}' is not a variable name`);
    config[`shell_environment_policy.set.${name}`] = value;
  }
  return Object.keys(config).length > 0 ? config : null;
}

export function threadStartParams(options: ThreadOptions): ThreadStartParams {
  return {
    ...(options.cwd ? { cwd: options.cwd } : {}),
    ...(options.model ? { model: options.model } : {}),
    config: threadConfig(options),
  };
}

export function threadResumeParams(threadId: string, options: ThreadOptions): ThreadResumeParams {
  return {
    threadId,
    ...(options.cwd ? { cwd: options.cwd } : {}),
    ...(options.model ? { model: options.model } : {}),
    config: threadConfig(options),
    excludeTurns: true,
  };
}

export function startedThread(answer: z.output<typeof threadStartResponseWire>): HostThread {
  return toHostThread(answer.thread);
}
