import { scriptTask, type TurnTool } from "@crw/brain";
import {
  createSubagentRuntime,
  ManualClock,
  MemoryRetryPolicySource,
  type Placement,
  type PoolEvent,
  parseSubagentConfig,
  predictsRunnerDispatch,
  RunnerExitedError,
  RunnerStartupError,
  RunnerUnavailableError,
  type SubagentConfig,
  type SubagentRunnerPoolDeps,
  SubagentSessionDispatch,
} from "@crw/subagent";
import { afterEach, describe, expect, expectTypeOf, it } from "vitest";
import { killChildRunners } from "./support/kill.js";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { waitFor } from "./support/runners.js";
import { childTurn, daemonRunner, quietHost } from "./support/sessionTurns.js";

closePoolsAfterEach();
const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((c) => c()));
});

/** The pool and dispatch as the daemon builds them, with settings the test may change between turns. */
function runtime(settings: Record<string, unknown> = {}) {
  const current = { config: parseSubagentConfig({ runnerKind: "scripted", ...settings }) };
  const events: PoolEvent[] = [];
  const placed: Placement[] = [];
  const local = daemonRunner();
  const { pool, dispatch } = createSubagentRuntime({
    config: () => current.config,
    retryPolicySource: () =>
      new MemoryRetryPolicySource({ revision: 1, maxRetries: 0, initialDelayMs: 0, multiplier: 1 }),
    inProcess: local.runner,
    onEvent: (e) => events.push(e),
    onPlaced: (_request, placement) => placed.push(placement),
  });
  closers.push(() => pool.close());
  const set = (change: Partial<SubagentConfig>) => {
    current.config = { ...current.config, ...change };
  };
  const dispatched = () => events.filter((e) => e.type === "turn_dispatched").length;
  return { pool, dispatch, events, placed, local, set, dispatched };
}

describe("the daemon's session dispatch: placement", () => {
  it("with the default settings a delegated child's turn runs in a forked runner, not in the daemon (S004-440)", async () => {
    const { dispatch, placed, local, dispatched } = runtime();
    expect(dispatch.placement()).toBe("runner");
    expect(await dispatch.runTurn(childTurn(), quietHost())).toEqual({ stopReason: "stop" });
    expect(placed).toEqual(["runner"]);
    expect(dispatched()).toBe(1);
    expect(local.ran).toEqual([]);
  });

  it("only an operator maximum of zero or a false switch runs a child in the daemon; a memory budget with room for no runner keeps runner mode and refuses (S004-518)", async () => {
    const zero = runtime({ maxRunners: 0 });
    await zero.dispatch.runTurn(childTurn("max-zero"), quietHost());
    expect(zero.local.ran).toEqual(["max-zero"]);
    expect(zero.dispatched()).toBe(0);

    const off = runtime({ subagentRunnerEnabled: false });
    await off.dispatch.runTurn(childTurn("switch-off"), quietHost());
    expect(off.local.ran).toEqual(["switch-off"]);
    expect(off.dispatched()).toBe(0);

    const memory = runtime({ maxRunners: 2, memoryBudgetBytes: 1, runnerMemoryBytes: 10 });
    const refused = await memory.dispatch.runTurn(childTurn("no-memory"), quietHost()).catch((e) => e);
    expect(refused).toBeInstanceOf(RunnerUnavailableError);
    expect(refused).toMatchObject({ reason: "no_capacity" });
    expect(memory.placed).toEqual(["runner"]);
    expect(memory.local.ran).toEqual([]);
  });

  it("the placement the daemon reads is the one decision each turn follows, as the settings change between turns (S004-150)", async () => {
    const { dispatch, placed, local, set, dispatched } = runtime();
    const predicted: Placement[] = [];
    const run = async (sessionId: string) => {
      predicted.push(dispatch.placement());
      await dispatch.runTurn(childTurn(sessionId), quietHost());
    };
    await run("default");
    set({ maxRunners: 0 });
    await run("max-zero");
    set({ maxRunners: 2, subagentRunnerEnabled: false });
    await run("switch-off");
    set({ subagentRunnerEnabled: true });
    await run("back-on");
    expect(predicted).toEqual(["runner", "in-process", "in-process", "runner"]);
    expect(placed).toEqual(predicted);
    // Where each turn actually ran agrees with it: two in forked runners, two in the daemon.
    expect(dispatched()).toBe(2);
    expect(local.ran).toEqual(["max-zero", "switch-off"]);
  });

  it("predictsRunnerDispatch takes the optional usable capability and an explicit enabled boolean (S004-516)", () => {
    expect(predictsRunnerDispatch(undefined, true)).toBe(false);
    expect(predictsRunnerDispatch({ usable: () => true }, true)).toBe(true);
    expect(predictsRunnerDispatch({ usable: () => true }, false)).toBe(false);
    expect(predictsRunnerDispatch({ usable: () => false }, true)).toBe(false);
  });

  it("pool checks default enabled to true; statistics read the operator-disabled bit from one sizing snapshot (S004-517)", () => {
    const on = makePool();
    expect(on.pool.usable()).toBe(true);
    expect(on.pool.health()).toMatchObject({ mode: "runner", operatorDisabled: false });
    const off = makePool({ enabled: () => false });
    expect(off.pool.usable()).toBe(false);
    expect(off.pool.health()).toMatchObject({ mode: "in-process", operatorDisabled: true });
    // Sizing that changes on every read: each health report agrees with the one snapshot it took.
    let reads = 0;
    const flapping = makePool({
      sizing: () => ({ maxRunners: reads++ % 2 === 0 ? 0 : 2, turnsPerRunner: 1 }),
    });
    for (let i = 0; i < 4; i++) {
      const health = flapping.pool.health();
      expect(health.operatorDisabled).toBe(health.maxRunners === 0);
      expect(health.mode).toBe(health.maxRunners === 0 ? "in-process" : "runner");
    }
  });
});

describe("the daemon's session dispatch: failures are never replayed", () => {
  it("a runner startup failure reaches the caller typed; the turn never runs in the daemon (S004-162)", async () => {
    const { pool } = makePool({ env: { CRW_RUNNER_FAULT: "exit-before-hello" } });
    const local = daemonRunner();
    const dispatch = new SubagentSessionDispatch({ pool, inProcess: local.runner, runnerKind: "scripted" });
    const host = quietHost();
    const error = await dispatch.runTurn(childTurn(), host).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunnerStartupError);
    expect(local.ran).toEqual([]);
    expect(host.recorded).toBe(0);
  });

  it("a startup that retries and runs out never falls back to the daemon nor runs the turn twice (S004-477)", async () => {
    const clock = new ManualClock();
    const source = new MemoryRetryPolicySource({
      revision: 1,
      maxRetries: 2,
      initialDelayMs: 10,
      multiplier: 1,
    });
    const { pool, events } = makePool({
      clock,
      env: { CRW_RUNNER_FAULT: "exit-before-hello" },
      retryPolicySource: () => source,
    });
    const local = daemonRunner();
    const dispatch = new SubagentSessionDispatch({ pool, inProcess: local.runner, runnerKind: "scripted" });
    const host = quietHost();
    const sent = dispatch.runTurn(childTurn(), host).catch((e: unknown) => e);
    for (let retry = 0; retry < 2; retry++) {
      await waitFor(() => clock.pendingSleeps === 1);
      clock.advance(10);
    }
    expect(await sent).toBeInstanceOf(RunnerStartupError);
    const attempts = events.filter((e) => e.type === "startup_failed");
    expect(attempts.map((e) => e.type === "startup_failed" && e.attempt)).toEqual([0, 1, 2]);
    expect(events.filter((e) => e.type === "turn_dispatched")).toEqual([]);
    expect(local.ran).toEqual([]);
    expect(host.recorded).toBe(0);
  });

  it("a build mismatch is refused typed on every turn, never run in the daemon instead (S004-376)", async () => {
    const { pool } = makePool({ buildId: "crw-runner-not-this-one" });
    const local = daemonRunner();
    const dispatch = new SubagentSessionDispatch({ pool, inProcess: local.runner, runnerKind: "scripted" });
    await expect(dispatch.runTurn(childTurn(), quietHost())).rejects.toMatchObject({
      category: "build_mismatch",
    });
    await expect(dispatch.runTurn(childTurn(), quietHost())).rejects.toMatchObject({
      category: "build_mismatch",
    });
    expect(local.ran).toEqual([]);
  });

  it("a failed turn is not replayed in either placement (S004-523)", async () => {
    // In a runner: the runner is killed while the turn's host tool runs.
    let executed = 0;
    let release: () => void = () => {};
    const blocked = new Promise<void>((r) => {
      release = r;
    });
    const echo: TurnTool = {
      name: "Echo",
      description: "echo",
      parameters: { type: "object", properties: {} },
      execute: async () => {
        executed++;
        await blocked;
        return { content: "echo" };
      },
    };
    const { pool, events } = makePool();
    const local = daemonRunner();
    let enabled = true;
    const dispatch = new SubagentSessionDispatch({
      pool,
      inProcess: local.runner,
      runnerKind: "scripted",
      runnerEnabled: () => enabled,
    });
    const task = scriptTask({ rounds: [[{ name: "Echo", arguments: {} }]], answer: "done" });
    let outcome: unknown;
    const running = dispatch.runTurn(childTurn("c1", { task, tools: [echo] }), quietHost()).then(
      (o) => {
        outcome = o;
      },
      (e: unknown) => {
        outcome = e;
      },
    );
    await waitFor(() => executed === 1);
    expect(await killChildRunners()).toBe(1);
    await waitFor(() => outcome !== undefined || executed > 1);
    expect(executed).toBe(1);
    expect(outcome).toBeInstanceOf(RunnerExitedError);
    release();
    await running;
    await new Promise((r) => setTimeout(r, 300));
    expect(executed).toBe(1);
    expect(events.filter((e) => e.type === "turn_dispatched")).toHaveLength(1);
    expect(local.ran).toEqual([]);
    // In the daemon: the daemon's own runner throws; it is asked once.
    enabled = false;
    let asked = 0;
    const failing = new SubagentSessionDispatch({
      inProcess: {
        runTurn: async () => {
          asked++;
          throw new Error("provider error");
        },
      },
      runnerEnabled: () => enabled,
    });
    await expect(failing.runTurn(childTurn(), quietHost())).rejects.toThrow("provider error");
    expect(asked).toBe(1);
  });
});

describe("pool dependencies", () => {
  it("SubagentRunnerPoolDeps carries no host callbacks; the pool owns them and consumers attach sinks (S004-506)", () => {
    type Keys = keyof SubagentRunnerPoolDeps;
    for (const k of [
      "onHeartbeat",
      "onExit",
      "onSteerSettled",
      "onResultDelivered",
      "onProviderUsage",
      "onProcessesChanged",
      "onRunnerExited",
    ] as const) {
      expectTypeOf<Extract<Keys, typeof k>>().toBeNever();
    }
    const { pool } = makePool();
    for (const attach of [
      pool.attachSteerSettledSink,
      pool.attachResultDeliveredSink,
      pool.attachProviderUsageSink,
      pool.attachProcessChangedSink,
      pool.attachRunnerExitTokensSink,
    ])
      expect(typeof attach).toBe("function");
  });
});
