import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
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

/** The built runner's files: the entry and every chunk it imports, statically or after boot. */
export function runnerBuildFiles(): string[] {
  const files = [RUNNER_ENTRY];
  for (let i = 0; i < files.length; i++) {
    const file = files[i] as string;
    for (const m of readFileSync(file, "utf8").matchAll(/(?:\bfrom |\bimport\()"(\.{1,2}\/[^"]+)"/g)) {
      const target = resolve(dirname(file), m[1] as string);
      if (!files.includes(target)) files.push(target);
    }
  }
  return files;
}

/**
 * Host settings for the stand-in runner (standInRunner.mjs): it puts a turn's host calls on the channel
 * unchecked and answers every release with an error.
 */
export const standInRunner = {
  entry: fileURLToPath(new URL("./standInRunner.mjs", import.meta.url)),
  buildId: "stand-in",
  env: { CRW_STANDIN_BUILD: "stand-in" },
};

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
