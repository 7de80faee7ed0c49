import { randomUUID } from "node:crypto";
import {
  buildIdentityOf,
  type DelegatedTurnRequest,
  MemoryRetryPolicySource,
  type ModelCatalogPublication,
  type RunnerHostEvent,
  resolveRunnerEntry,
  SubagentRunnerHost,
  type SubagentRunnerHostDeps,
} from "@crw/subagent";

export const RUNNER_ENTRY = resolveRunnerEntry(new URL("../../src/runnerEntry.ts", import.meta.url).href);
export const BUILD_ID = buildIdentityOf(RUNNER_ENTRY);

export const catalog: ModelCatalogPublication = {
  revision: 1,
  public: [{ id: "scripted-1", provider: "scripted" }],
  accounts: { alice: [{ id: "scripted-1", provider: "scripted" }] },
};

export function policySource(maxRetries = 2) {
  return new MemoryRetryPolicySource({ revision: 1, maxRetries, initialDelayMs: 100, multiplier: 2 });
}

export function hostDeps(overrides: Partial<SubagentRunnerHostDeps> = {}) {
  const events: RunnerHostEvent[] = [];
  const deps: SubagentRunnerHostDeps = {
    runnerId: `r-${randomUUID().slice(0, 8)}`,
    entry: RUNNER_ENTRY,
    buildId: BUILD_ID,
    retryPolicySource: policySource(),
    catalog,
    bootTimeoutMs: 20_000,
    onEvent: (e) => events.push(e),
    ...overrides,
  };
  return { deps, events };
}

export async function startHost(overrides: Partial<SubagentRunnerHostDeps> = {}) {
  const { deps, events } = hostDeps(overrides);
  const host = await SubagentRunnerHost.start(deps);
  return { host, events, deps };
}

export function turn(partial: Partial<DelegatedTurnRequest> = {}): DelegatedTurnRequest {
  return {
    turnId: `t-${randomUUID()}`,
    channelId: "ch-1",
    sessionId: `s-${randomUUID().slice(0, 8)}`,
    prompt: "do the thing",
    ...partial,
  };
}

export async function waitFor(check: () => boolean | Promise<boolean>, ms = 10_000): Promise<void> {
  const until = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > until) throw new Error("condition not reached in time");
    await new Promise((r) => setTimeout(r, 10));
  }
}
