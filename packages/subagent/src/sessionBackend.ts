import type { DelegatedExecutionScope, SessionTurnRunner } from "@crw/brain";
import type { AgentOptions, SessionRunnerKind } from "./protocol/sessionTurn.js";
import { installProviderUsageTap, type ProviderUsageReport } from "./providerUsage.js";

/**
 * What a runner needs from the delegation core to run a session turn: its SessionTurnRunners and its scope
 * parser. Loaded on the first session turn, so a runner's boot does not pay for the agent loop's imports.
 */
export interface SessionTurnBackend {
  runner(kind: SessionRunnerKind): SessionTurnRunner;
  parseScope(raw: unknown): DelegatedExecutionScope | null;
}

export async function loadBrainSessionBackend(
  options: AgentOptions = {},
  hooks: { readonly providerUsage?: ProviderUsageReport } = {},
): Promise<SessionTurnBackend> {
  const brain = await import("@crw/brain");
  // Provider usage of this runner's agent loops reaches the daemon (see providerUsage.ts).
  if (hooks.providerUsage) installProviderUsageTap((await brain.loadPi()).ai, hooks.providerUsage);
  // Script steps were checked as records at the IPC edge; brain's provider parses each step itself.
  const agent = brain.createAgentTurnRunner(options as Parameters<typeof brain.createAgentTurnRunner>[0]);
  const scripted = brain.createScriptedTurnRunner();
  return {
    runner: (kind) => (kind === "agent" ? agent : scripted),
    parseScope: (raw) =>
      raw === null || raw === undefined
        ? null
        : brain.parseDelegatedExecutionScope(raw as DelegatedExecutionScope),
  };
}
