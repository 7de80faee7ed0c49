import {
  type ChildTurnExecutor,
  type DelegatedTurnRequest,
  ManualClock,
  MemoryRetryPolicySource,
  predictsRunnerDispatch,
  RunnerStartupError,
  ScriptedTurnExecutor,
  SubagentDispatch,
  type SubagentRunnerPoolDeps,
} from "@crw/subagent";
import { describe, expect, expectTypeOf, it } from "vitest";
import { closePoolsAfterEach, effectsFile, makePool } from "./support/pools.js";
import { turn, waitFor } from "./support/runners.js";

closePoolsAfterEach();

/** The daemon's own executor (the rollback path), counting the turns it ran. */
function inProcess() {
  const ran: string[] = [];
  const scripted = new ScriptedTurnExecutor();
  const executor: ChildTurnExecutor = {
    runTurn: (request, ctx) => {
      ran.push(request.turnId);
      return scripted.runTurn(request, ctx);
    },
  };
  return { executor, ran };
}

describe("SubagentDispatch placement", () => {
  it("runtime.subagentRunnerEnabled defaults to true: ordinary work runs in a forked runner (S004-440)", async () => {
    const { pool, events } = makePool();
    const local = inProcess();
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    expect(dispatch.placement()).toBe("runner");
    const result = await dispatch.send(turn({ script: [{ kind: "text", text: "from runner" }] }));
    expect(result.text).toBe("from runner");
    expect(local.ran).toEqual([]);
    expect(events.filter((e) => e.type === "turn_dispatched")).toHaveLength(1);
  });

  it("an explicit false rolls back to in-process per call, without a new deployment (S004-441)", async () => {
    const { pool, events } = makePool();
    const local = inProcess();
    let enabled = false;
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor, runnerEnabled: () => enabled });
    const inDaemon = await dispatch.send(turn({ script: [{ kind: "text", text: "local" }] }));
    expect(inDaemon.text).toBe("local");
    expect(local.ran).toHaveLength(1);
    expect(events).toEqual([]);
    enabled = true;
    await dispatch.send(turn());
    expect(local.ran).toHaveLength(1);
    expect(events.filter((e) => e.type === "turn_dispatched")).toHaveLength(1);
  });

  it("dispatch is the one placement decision; only an operator maximum of zero or a false switch selects daemon-local execution (S004-150 S004-518)", () => {
    const zero = makePool({ size: { maxRunners: 0 } });
    const memoryZero = makePool({ size: { maxRunners: 2, memoryBudgetBytes: 1, runnerMemoryBytes: 10 } });
    const local = inProcess();
    expect(new SubagentDispatch({ pool: zero.pool, inProcess: local.executor }).placement()).toBe(
      "in-process",
    );
    expect(new SubagentDispatch({ pool: memoryZero.pool, inProcess: local.executor }).placement()).toBe(
      "runner",
    );
    expect(
      new SubagentDispatch({
        pool: memoryZero.pool,
        inProcess: local.executor,
        runnerEnabled: () => false,
      }).placement(),
    ).toBe("in-process");
  });

  it("predictsRunnerDispatch takes the optional usable capability and an explicit enabled boolean (S004-516)", () => {
    expect(predictsRunnerDispatch(undefined, true)).toBe(false);
    expect(predictsRunnerDispatch({ usable: () => true }, true)).toBe(true);
    expect(predictsRunnerDispatch({ usable: () => true }, false)).toBe(false);
    expect(predictsRunnerDispatch({ usable: () => false }, true)).toBe(false);
  });

  it("pool checks default enabled to true; statistics read the operator-disabled bit from one snapshot (S004-517)", () => {
    const on = makePool();
    expect(on.pool.usable()).toBe(true);
    expect(on.pool.health()).toMatchObject({ mode: "runner", operatorDisabled: false });
    const off = makePool({ enabled: () => false });
    expect(off.pool.usable()).toBe(false);
    expect(off.pool.health()).toMatchObject({ mode: "in-process", operatorDisabled: true });
  });
});

describe("SubagentDispatch failure and fences", () => {
  it("the same remote-call fence is held for either mode, including the queue wait (S004-161)", async () => {
    const { pool } = makePool();
    const local = inProcess();
    const held = new Set<string>();
    const order: string[] = [];
    let enabled = true;
    const dispatch = new SubagentDispatch({
      pool,
      inProcess: local.executor,
      runnerEnabled: () => enabled,
      fence: async (request: DelegatedTurnRequest, work) => {
        held.add(request.turnId);
        order.push(`enter ${request.sessionId}`);
        try {
          return await work();
        } finally {
          held.delete(request.turnId);
          order.push(`leave ${request.sessionId}`);
        }
      },
    });
    const first = turn({ sessionId: "f1", script: [{ kind: "wait", ms: 300 }] });
    const queued = turn({ sessionId: "f2", channelId: "other" });
    const a = dispatch.send(first);
    const b = dispatch.send(queued);
    await waitFor(() => pool.sessionState("f1") === "running");
    expect(pool.sessionState("f2")).toBe("queued");
    expect(held.has(queued.turnId)).toBe(true);
    await Promise.all([a, b]);
    expect(held.size).toBe(0);
    enabled = false;
    await dispatch.send(turn({ sessionId: "f3" }));
    expect(order).toEqual(["enter f1", "enter f2", "leave f1", "leave f2", "enter f3", "leave f3"]);
  });

  it("startup failures never replay delegated work in the daemon; the caller gets the typed error (S004-162)", async () => {
    const effects = await effectsFile();
    const { pool } = makePool({ env: { CRW_RUNNER_FAULT: "exit-before-hello" } });
    const local = inProcess();
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    const error = await dispatch
      .send(turn({ script: [{ kind: "appendFile", path: effects.path, line: "ran" }] }))
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunnerStartupError);
    expect(local.ran).toEqual([]);
    expect(await effects.lines()).toEqual([]);
  });

  it("a startup that retries and runs out never falls back to the daemon nor runs the turn twice (S004-477)", async () => {
    const effects = await effectsFile();
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
    const local = inProcess();
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    const sent = dispatch
      .send(turn({ script: [{ kind: "appendFile", path: effects.path, line: "ran" }] }))
      .catch((e: unknown) => e);
    for (let retry = 0; retry < 2; retry++) {
      await waitFor(() => clock.pendingSleeps === 1);
      clock.advance(10);
    }
    expect(await sent).toBeInstanceOf(RunnerStartupError);
    const attempts = events.filter((e) => e.type === "startup_failed");
    expect(attempts.map((e) => e.type === "startup_failed" && e.attempt)).toEqual([0, 1, 2]);
    expect(events.filter((e) => e.type === "turn_dispatched")).toEqual([]);
    expect(local.ran).toEqual([]);
    expect(await effects.lines()).toEqual([]);
  });

  it("a build mismatch does not fall back to local execution either (S004-376)", async () => {
    const { pool } = makePool({ buildId: "crw-runner-not-this-one" });
    const local = inProcess();
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    await expect(dispatch.send(turn())).rejects.toMatchObject({ category: "build_mismatch" });
    await expect(dispatch.send(turn())).rejects.toMatchObject({ category: "build_mismatch" });
    expect(local.ran).toEqual([]);
  });

  it("a failed turn is not replayed in either mode (S004-523)", async () => {
    const effects = await effectsFile();
    const failing = (line: string) =>
      turn({
        script: [
          { kind: "appendFile", path: effects.path, line },
          { kind: "fail", message: "provider error", code: "provider_failed" },
        ],
      });
    const { pool } = makePool();
    const local = inProcess();
    let enabled = true;
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor, runnerEnabled: () => enabled });
    await expect(dispatch.send(failing("runner"))).rejects.toMatchObject({
      remote: { code: "provider_failed" },
    });
    enabled = false;
    await expect(dispatch.send(failing("local"))).rejects.toMatchObject({ code: "provider_failed" });
    expect(await effects.lines()).toEqual(["runner", "local"]);
  });

  it("a Delegate call and a workflow node go through the same dispatch and the same runners (S004-149)", async () => {
    const { pool, events } = makePool();
    const dispatch = new SubagentDispatch({ pool, inProcess: inProcess().executor });
    await dispatch.send(turn({ sessionId: "delegate-child", channelId: "parent" }));
    await dispatch.send(turn({ sessionId: "workflow-node-1", channelId: "parent" }));
    const runners = new Set(events.flatMap((e) => (e.type === "turn_dispatched" ? [e.runnerId] : [])));
    expect(runners.size).toBe(1);
  });
});

describe("read-only views through dispatch", () => {
  it("without a routed runner the same seam views the in-daemon child directly (S004-486)", async () => {
    const local = inProcess();
    const dispatch = new SubagentDispatch({ inProcess: local.executor, runnerEnabled: () => false });
    await dispatch.send(
      turn({ sessionId: "inproc", prompt: "q", model: "scripted-1", script: [{ kind: "text", text: "a" }] }),
    );
    const seen: string[] = [];
    const view = await dispatch.tap("inproc", (e) => seen.push(e.kind));
    expect(view.snapshot).toMatchObject({ model: "scripted-1", history: [{ text: "q" }, { text: "a" }] });
    await dispatch.send(turn({ sessionId: "inproc", script: [{ kind: "reasoning", text: "r" }] }));
    expect(seen).toEqual(["reasoning"]);
    await view.close();
    expect(local.ran).toHaveLength(2);
  });

  it("a routed child is viewed through the runner's tap protocol (S004-481)", async () => {
    const { pool } = makePool();
    const dispatch = new SubagentDispatch({ pool, inProcess: inProcess().executor });
    await dispatch.send(turn({ sessionId: "routed", prompt: "p", script: [{ kind: "text", text: "t" }] }));
    const view = await dispatch.tap("routed", () => {});
    expect(view.snapshot.history.map((h) => h.text)).toEqual(["p", "t"]);
    await view.close();
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
