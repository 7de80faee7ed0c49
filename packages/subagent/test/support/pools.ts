import { readFile } from "node:fs/promises";
import { join } from "node:path";
import {
  type PoolEvent,
  type RunnerPoolSizing,
  SubagentRunnerPool,
  type SubagentRunnerPoolDeps,
} from "@crw/subagent";
import { afterEach } from "vitest";
import { BUILD_ID, catalog, policySource, RUNNER_ENTRY } from "./runners.js";
import { tempDir } from "./tmp.js";

const pools: SubagentRunnerPool[] = [];

/** Close every pool a test made (its runners are real processes). */
export function closePoolsAfterEach(): void {
  afterEach(async () => {
    await Promise.all(pools.splice(0).map((p) => p.close()));
  });
}

export function makePool(
  overrides: Partial<SubagentRunnerPoolDeps> & { size?: Partial<RunnerPoolSizing> } = {},
) {
  const events: PoolEvent[] = [];
  const { size, ...rest } = overrides;
  const sizing: RunnerPoolSizing = { maxRunners: 1, turnsPerRunner: 1, ...size };
  const source = policySource();
  const pool = new SubagentRunnerPool({
    sizing: () => sizing,
    retryPolicySource: () => source,
    catalog: () => catalog,
    entry: RUNNER_ENTRY,
    buildId: BUILD_ID,
    bootTimeoutMs: 20_000,
    onEvent: (e) => events.push(e),
    ...rest,
  });
  pools.push(pool);
  return { pool, events, sizing, source };
}

export async function effectsFile(): Promise<{ path: string; lines: () => Promise<string[]> }> {
  const dir = tempDir("effects");
  const path = join(dir, "effects.log");
  return {
    path,
    lines: async () => {
      try {
        return (await readFile(path, "utf8")).split("\n").filter(Boolean);
      } catch {
        return [];
      }
    },
  };
}
