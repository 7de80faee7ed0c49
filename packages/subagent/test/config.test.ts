import { randomUUID } from "node:crypto";
import {
  captureDelegatedExecutionScope,
  createScriptedTurnRunner,
  parseDelegatedExecutionScope,
  type TurnHost,
  type TurnRequest,
} from "@crw/brain";
import {
  createSubagentRuntime,
  MemoryRetryPolicySource,
  type PoolEvent,
  parseSubagentConfig,
  type SubagentConfig,
} from "@crw/subagent";
import { afterEach, describe, expect, it } from "vitest";

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((c) => c()));
});

const host: TurnHost = {
  record: async () => {},
  beforeToolCall: async () => {},
  drainSteering: async () => [],
  progress: () => {},
};
const childTurn = (): TurnRequest => ({
  sessionId: randomUUID(),
  principalAccountId: "acct",
  model: "scripted",
  systemPrompt: "worker",
  context: [{ role: "user", content: "task" }],
  tools: [],
  scope: parseDelegatedExecutionScope(
    captureDelegatedExecutionScope({ accountId: "acct", target: { kind: "host", ref: null } }),
  ),
  readOnly: false,
  workDir: null,
  signal: new AbortController().signal,
});

describe("runtime configuration", () => {
  it("runtime.subagentRunnerEnabled is true by default (S004-440)", () => {
    const config = parseSubagentConfig({});
    expect(config.subagentRunnerEnabled).toBe(true);
    expect(config).toMatchObject({
      maxRunners: 2,
      turnsPerRunner: 4,
      bootTimeoutMs: 60_000,
      runnerKind: "agent",
    });
    expect(() => parseSubagentConfig({ subagentRunnerEnabled: "yes" })).toThrow();
    expect(() => parseSubagentConfig({ bootTimeoutMs: 120_000 })).toThrow();
    expect(() => parseSubagentConfig({ unknownSwitch: true })).toThrow();
  });

  it("flipping the setting at run time moves the next turn between runner and daemon, no redeploy (S004-441)", async () => {
    let config: SubagentConfig = parseSubagentConfig({ runnerKind: "scripted", maxRunners: 1 });
    const events: PoolEvent[] = [];
    const scripted = createScriptedTurnRunner();
    let ranHere = 0;
    const { pool, dispatch } = createSubagentRuntime({
      config: () => config,
      retryPolicySource: () =>
        new MemoryRetryPolicySource({ revision: 1, maxRetries: 0, initialDelayMs: 0, multiplier: 1 }),
      inProcess: {
        runTurn: (request, turnHost) => {
          ranHere++;
          return scripted.runTurn(request, turnHost);
        },
      },
      onEvent: (e) => events.push(e),
    });
    closers.push(() => pool.close());
    expect(await dispatch.runTurn(childTurn(), host)).toEqual({ stopReason: "stop" });
    expect(events.filter((e) => e.type === "turn_dispatched")).toHaveLength(1);
    expect(ranHere).toBe(0);
    config = { ...config, subagentRunnerEnabled: false };
    expect(dispatch.placement()).toBe("in-process");
    expect(await dispatch.runTurn(childTurn(), host)).toEqual({ stopReason: "stop" });
    expect(events.filter((e) => e.type === "turn_dispatched")).toHaveLength(1);
    expect(ranHere).toBe(1);
    expect(pool.health()).toMatchObject({ mode: "in-process", operatorDisabled: true });
    config = { ...config, subagentRunnerEnabled: true };
    await dispatch.runTurn(childTurn(), host);
    expect(events.filter((e) => e.type === "turn_dispatched")).toHaveLength(2);
    expect(ranHere).toBe(1);
  });

  it("no environment switch selects runner use, and there are no duplicate runner script variants (S004-444)", async () => {
    const { readFile, readdir } = await import("node:fs/promises");
    const { join } = await import("node:path");
    const saved = { ...process.env };
    try {
      process.env.ELOWEN_SUBAGENT_RUNNER = "0";
      process.env.CRW_SUBAGENT_RUNNER = "0";
      const config = parseSubagentConfig({});
      const { pool, dispatch } = createSubagentRuntime({
        config: () => config,
        retryPolicySource: () =>
          new MemoryRetryPolicySource({ revision: 1, maxRetries: 0, initialDelayMs: 0, multiplier: 1 }),
        inProcess: createScriptedTurnRunner(),
      });
      closers.push(() => pool.close());
      expect(dispatch.placement()).toBe("runner");
    } finally {
      process.env = saved;
    }
    const pkg = join(import.meta.dirname, "..");
    const scripts = Object.keys(JSON.parse(await readFile(join(pkg, "package.json"), "utf8")).scripts);
    expect(scripts.filter((name) => name.endsWith(":runner"))).toEqual([]);
    // The only environment the sources read is the runner's named fault point for crash tests.
    const read: string[] = [];
    for (const file of await readdir(join(pkg, "src"), { recursive: true })) {
      if (!String(file).endsWith(".ts")) continue;
      const text = await readFile(join(pkg, "src", String(file)), "utf8");
      for (const m of text.matchAll(/process\.env\.([A-Z_]+)/g)) read.push(m[1] as string);
    }
    expect([...new Set(read)]).toEqual(["CRW_RUNNER_FAULT"]);
  });
});
