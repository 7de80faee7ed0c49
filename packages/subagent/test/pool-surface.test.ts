import { getEventListeners } from "node:events";
import {
  DelegationAbortedError,
  effectiveRunners,
  type ModelCatalogPublication,
  RunnerUnavailableError,
  SubagentRunnerHost,
} from "@crw/subagent";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { catalog, turn, waitFor } from "./support/runners.js";
import { childTurn, quietHost } from "./support/sessionTurns.js";

closePoolsAfterEach();

const wait = (ms: number) => [{ kind: "wait" as const, ms }];

/** Bring a pool of two runners with one turn each up to both runners, idle again. */
async function twoIdleRunners(pool: ReturnType<typeof makePool>["pool"]): Promise<void> {
  const hold = new AbortController();
  const held = pool.runTurn(turn({ script: wait(60_000) }), { signal: hold.signal });
  await waitFor(() => pool.health().turns === 1);
  // runner-1 is full: this turn brings up runner-2.
  await pool.runTurn(turn({ channelId: "ch-2" }));
  hold.abort();
  await held;
}

describe("the pool's size and the operator's switch", () => {
  it("effective runners: the operator's maximum, floored at zero, bounded by memory only when both sizes are set and a runner's size is positive", () => {
    expect(effectiveRunners({ maxRunners: 3, turnsPerRunner: 1 })).toBe(3);
    expect(effectiveRunners({ maxRunners: 2.9, turnsPerRunner: 1 })).toBe(2);
    expect(effectiveRunners({ maxRunners: -2, turnsPerRunner: 1 })).toBe(0);
    const sized = (maxRunners: number, memoryBudgetBytes?: number, runnerMemoryBytes?: number) =>
      effectiveRunners({ maxRunners, turnsPerRunner: 1, memoryBudgetBytes, runnerMemoryBytes });
    // 2500 bytes hold two runners of 1000: fewer than the maximum of 8.
    expect(sized(8, 2_500, 1_000)).toBe(2);
    // Room for five, but the operator allows one.
    expect(sized(1, 5_000, 1_000)).toBe(1);
    expect(sized(4, 5_000, undefined)).toBe(4);
    expect(sized(4, undefined, 1_000)).toBe(4);
    // A runner size of zero or less bounds nothing, whatever the budget.
    expect(sized(4, 0, 0)).toBe(4);
    expect(sized(4, 5_000, -1)).toBe(4);
  });

  it("a false switch or a maximum of zero is daemon-local execution; a memory-derived zero stays runner mode", () => {
    // Two runners allowed, and none: runner mode and daemon-local execution, each with nothing running.
    for (const [maxRunners, mode] of [
      [2, "runner"],
      [0, "in-process"],
    ] as const) {
      const { pool } = makePool({ size: { maxRunners } });
      expect(pool.usable()).toBe(mode === "runner");
      expect(pool.health()).toEqual({
        mode,
        operatorDisabled: mode === "in-process",
        maxRunners,
        effectiveRunners: maxRunners,
        queued: 0,
        turns: 0,
        sessions: 0,
        nestedTurns: 0,
        runners: [],
        startupRetry: null,
        spawnFailure: null,
        restartRequired: false,
      });
    }
    const off = makePool({ enabled: () => false }).pool;
    expect(off.usable()).toBe(false);
    expect(off.health()).toMatchObject({ mode: "in-process", operatorDisabled: true, maxRunners: 1 });
    const switchedOn = makePool({ enabled: () => true }).pool;
    expect(switchedOn.usable()).toBe(true);
    expect(switchedOn.health()).toMatchObject({ mode: "runner", operatorDisabled: false });
    const noRoom = makePool({ size: { maxRunners: 2, memoryBudgetBytes: 10, runnerMemoryBytes: 100 } }).pool;
    expect(noRoom.usable()).toBe(true);
    expect(noRoom.health()).toMatchObject({ mode: "runner", operatorDisabled: false, effectiveRunners: 0 });
  });

  it("a turn refused for want of memory says so", async () => {
    const { pool } = makePool({ size: { maxRunners: 2, memoryBudgetBytes: 10, runnerMemoryBytes: 100 } });
    const error = await pool.runTurn(turn()).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunnerUnavailableError);
    expect(error).toMatchObject({
      reason: "no_capacity",
      message: "no sub-agent runner capacity (memory budget)",
    });
  });
});

describe("a pool with no runner", () => {
  it("knows no session: no execution, no view, and a release is released; reset and close do nothing", async () => {
    const { pool, events } = makePool();
    expect(pool.executionOf("nobody")).toBeUndefined();
    expect(pool.executions()).toEqual([]);
    expect(await pool.tap("nobody", () => {})).toBeUndefined();
    expect(await pool.release("nobody")).toBe("released");
    await pool.reset();
    expect(pool.health()).toMatchObject({ runners: [], spawnFailure: null, startupRetry: null });
    await pool.close();
    expect(events).toEqual([]);
  });
});

describe("what the pool tells of its runners and sessions", () => {
  it("a queued session has no runner yet; executions lists the running and the queued", async () => {
    const { pool } = makePool();
    const hold = new AbortController();
    const running = pool.runTurn(turn({ sessionId: "run", script: wait(60_000) }), { signal: hold.signal });
    await waitFor(() => pool.sessionState("run") === "running");
    const queued = pool.runTurn(turn({ sessionId: "waits", channelId: "ch-2" }));
    expect(pool.executionOf("waits")).toEqual({ runnerId: null, state: "queued" });
    expect(pool.executions()).toEqual([
      { sessionId: "run", runnerId: "runner-1", state: "running" },
      { sessionId: "waits", runnerId: null, state: "queued" },
    ]);
    hold.abort();
    await running;
    expect((await queued).stopReason).toBe("end");
  });

  it("a session whose first turn runs stays running when its second, still queued, is withdrawn", async () => {
    const { pool } = makePool();
    const hold = new AbortController();
    const withdraw = new AbortController();
    // Both wait for the first runner; the first dispatched takes its only slot.
    const first = pool.runTurn(turn({ sessionId: "both", script: wait(60_000) }), { signal: hold.signal });
    const second = pool
      .runTurn(turn({ sessionId: "both", channelId: "ch-2" }), { signal: withdraw.signal })
      .catch((e: unknown) => e);
    await waitFor(() => pool.health().turns === 1);
    expect(pool.health().queued).toBe(1);
    expect(pool.sessionState("both")).toBe("running");
    withdraw.abort();
    expect(await second).toBeInstanceOf(DelegationAbortedError);
    expect(pool.sessionState("both")).toBe("running");
    hold.abort();
    expect((await first).stopReason).toBe("aborted");
    expect(pool.sessionState("both")).toBeUndefined();
  });

  it("a session turn names its parent: a child's turn on its parent's runner is a nested edge", async () => {
    const { pool, events } = makePool();
    await pool.runTurn(turn({ sessionId: "parent-s" }));
    const meta = {
      turnId: "child-turn",
      channelId: "ch-s",
      parentSessionId: "parent-s",
      runner: "scripted",
    } as const;
    expect(await pool.runSessionTurn(childTurn("child-s"), quietHost(), meta)).toMatchObject({
      stopReason: "stop",
    });
    expect(events.filter((e) => e.type === "turn_dispatched" && e.turnId === "child-turn")).toEqual([
      { type: "turn_dispatched", turnId: "child-turn", runnerId: "runner-1", nested: true },
    ]);
  });

  it("a runner's health: its turns and sessions, and no load until its first heartbeat", async () => {
    const { pool } = makePool({ heartbeatIntervalMs: 60_000 });
    await pool.runTurn(turn({ sessionId: "once" }));
    expect(pool.health().runners).toEqual([
      {
        runnerId: "runner-1",
        turns: 0,
        sessions: 1,
        nestedTurns: 0,
        eventLoopP99Ms: null,
        memoryBytes: null,
        memoryComplete: null,
      },
    ]);
  });

  it("a runner's health carries its last heartbeat's event-loop delay and memory", async () => {
    const { pool } = makePool({ heartbeatIntervalMs: 50 });
    await pool.runTurn(turn());
    await waitFor(() => pool.health().runners[0]?.memoryBytes !== null);
    const [runner] = pool.health().runners;
    expect(runner?.eventLoopP99Ms).toEqual(expect.any(Number));
    expect(runner?.memoryBytes).toBeGreaterThan(0);
    expect(runner?.memoryComplete).toEqual(expect.any(Boolean));
  });

  it("a caller's progress reaches its onProgress, and a settled turn leaves no listener on the caller's signal", async () => {
    const { pool } = makePool();
    const caller = new AbortController();
    const progress: string[] = [];
    const running = pool.runTurn(turn({ script: [{ kind: "text", text: "halfway" }] }), {
      signal: caller.signal,
      onProgress: (text) => progress.push(text),
    });
    expect(getEventListeners(caller.signal, "abort")).toHaveLength(1);
    expect((await running).text).toBe("halfway");
    expect(progress).toEqual(["halfway"]);
    expect(getEventListeners(caller.signal, "abort")).toHaveLength(0);
  });
});

describe("reset, close and catalog publication", () => {
  it("a reset hands every idle session back and retires idle runners; a runner with a running turn stays", async () => {
    const { pool, events } = makePool({ size: { maxRunners: 2, turnsPerRunner: 2 } });
    const holdA1 = new AbortController();
    const holdA2 = new AbortController();
    const a1 = pool.runTurn(turn({ sessionId: "a1", script: wait(60_000) }), { signal: holdA1.signal });
    const a2 = pool.runTurn(turn({ sessionId: "a2", script: wait(60_000) }), { signal: holdA2.signal });
    await waitFor(() => pool.health().turns === 2);
    // runner-1 is full: b needs a second runner.
    await pool.runTurn(turn({ sessionId: "b", channelId: "ch-b" }));
    holdA2.abort();
    await a2;
    expect(
      pool.health().runners.map(({ runnerId, turns, sessions }) => ({ runnerId, turns, sessions })),
    ).toEqual([
      { runnerId: "runner-1", turns: 1, sessions: 2 },
      { runnerId: "runner-2", turns: 0, sessions: 1 },
    ]);
    await pool.reset();
    // a2 is idle on the runner that stays: handed back; a1 still runs there and keeps its route.
    expect([pool.routeOf("a1"), pool.routeOf("a2"), pool.routeOf("b")]).toEqual([
      "runner-1",
      undefined,
      undefined,
    ]);
    expect(pool.health().runners.map((r) => r.runnerId)).toEqual(["runner-1"]);
    expect(
      events.filter((e) => e.type === "runner_exited").map((e) => e.type === "runner_exited" && e.runnerId),
    ).toEqual(["runner-2"]);
    holdA1.abort();
    expect((await a1).stopReason).toBe("aborted");
  });

  it("a release answered after its session moved to another runner leaves the new route alone", async () => {
    const { pool } = makePool({ size: { maxRunners: 2, turnsPerRunner: 1 } });
    await pool.runTurn(turn({ sessionId: "mover" }));
    const hold = new AbortController();
    const held = pool.runTurn(turn({ sessionId: "holder", channelId: "ch-h", script: wait(60_000) }), {
      signal: hold.signal,
    });
    await waitFor(() => pool.health().turns === 1);
    // runner-1 is full: this turn brings up runner-2, free once it ends.
    await pool.runTurn(turn({ channelId: "ch-o" }));
    expect(pool.routeOf("mover")).toBe("runner-1");
    const releasing = pool.release("mover");
    // While runner-1 answers, the session's next turn finds its runner full and moves to runner-2.
    const moved = pool.runTurn(turn({ sessionId: "mover", channelId: "ch-m" }));
    expect(pool.routeOf("mover")).toBe("runner-2");
    expect(await releasing).toBe("released");
    expect(pool.routeOf("mover")).toBe("runner-2");
    await moved;
    hold.abort();
    await held;
  });

  it("close shuts every runner down", async () => {
    const { pool, events } = makePool({ size: { maxRunners: 2, turnsPerRunner: 1 } });
    await twoIdleRunners(pool);
    expect(pool.health().runners).toHaveLength(2);
    await pool.close();
    expect(pool.health().runners).toEqual([]);
    expect(events.filter((e) => e.type === "runner_exited")).toHaveLength(2);
  });

  it("publishCatalog sends the daemon's current catalog to every ready runner; one that fails does not fail the rest", async () => {
    let current: ModelCatalogPublication = catalog;
    const { pool } = makePool({ size: { maxRunners: 2, turnsPerRunner: 1 }, catalog: () => current });
    await twoIdleRunners(pool);
    const publish = vi.spyOn(SubagentRunnerHost.prototype, "publishCatalog");
    onTestFinished(() => publish.mockRestore());
    publish.mockRejectedValueOnce(new Error("runner gone"));
    current = { ...catalog, revision: 2 };
    await expect(pool.publishCatalog()).resolves.toBeUndefined();
    expect(publish.mock.calls).toEqual([[current], [current]]);
    expect(publish.mock.contexts.map((host) => (host as SubagentRunnerHost).runnerId).sort()).toEqual([
      "runner-1",
      "runner-2",
    ]);
  });
});

describe("what a runner reports, passed on", () => {
  it("a runner's refused frames and its log lines become pool events with its id", async () => {
    const { pool, events } = makePool({ env: { CRW_RUNNER_FAULT: "garbage-before-hello" } });
    expect((await pool.runTurn(turn())).stopReason).toBe("end");
    const refused = events.filter((e) => e.type === "frame_refused");
    expect(refused.length).toBeGreaterThanOrEqual(2);
    for (const e of refused)
      expect(e).toEqual({ type: "frame_refused", runnerId: "runner-1", issues: expect.any(String) });
    await pool.close();
    // The runner logs its stop on stderr, one JSON line.
    const stopping = {
      type: "runner_log",
      runnerId: "runner-1",
      line: expect.stringContaining("runner stopping"),
    };
    await waitFor(() => events.some((e) => e.type === "runner_log" && e.line.includes("runner stopping")));
    expect(events).toContainEqual(stopping);
  });

  it("a sink that throws is reported as sink_failed with its name; no sink attached is no failure", async () => {
    const { pool, events } = makePool();
    expect((await pool.runTurn(turn())).stopReason).toBe("end");
    // runner-1 started with no process sink attached.
    expect(events.filter((e) => e.type === "sink_failed")).toEqual([]);
    pool.attachProcessChangedSink(() => {
      throw new Error("process table unavailable");
    });
    await pool.close();
    expect(events.filter((e) => e.type === "sink_failed")).toEqual([
      { type: "sink_failed", sink: "processChanged", error: "process table unavailable" },
    ]);
  });
});
