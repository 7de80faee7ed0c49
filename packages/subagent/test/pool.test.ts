import { DelegationAbortedError, RunnerExitedError, RunnerUnavailableError } from "@crw/subagent";
import { describe, expect, it } from "vitest";
import { killChildRunners } from "./support/kill.js";
import { closePoolsAfterEach, effectsFile, makePool } from "./support/pools.js";
import { standInRunner, turn, waitFor } from "./support/runners.js";

closePoolsAfterEach();

describe("runner pool admission", () => {
  it("with no requested capacity there is no startup episode (S004-479)", async () => {
    const { pool, events } = makePool();
    await new Promise((r) => setTimeout(r, 50));
    expect(events).toEqual([]);
    expect(pool.health()).toMatchObject({ runners: [], startupRetry: null, spawnFailure: null, queued: 0 });
  });

  it("a turn arriving when every runner is full waits in the queue, reported queued, instead of being refused (S004-184)", async () => {
    const { pool } = makePool({ size: { maxRunners: 1, turnsPerRunner: 1 } });
    const first = pool.runTurn(
      turn({
        sessionId: "s-a",
        script: [
          { kind: "wait", ms: 300 },
          { kind: "text", text: "A" },
        ],
      }),
    );
    expect(pool.sessionState("s-a")).toBe("queued");
    await waitFor(() => pool.sessionState("s-a") === "running");
    // Only now is the one runner full: the second turn arrives to find no free slot and no room to grow.
    const second = pool.runTurn(
      turn({ sessionId: "s-b", channelId: "ch-2", script: [{ kind: "text", text: "B" }] }),
    );
    expect(pool.sessionState("s-b")).toBe("queued");
    expect(pool.health().queued).toBe(1);
    expect((await first).text).toBe("A");
    expect((await second).text).toBe("B");
    expect(pool.sessionState("s-b")).toBeUndefined();
    expect(pool.health().runners).toHaveLength(1);
  });

  it("the admission queue is a FairQueue: several producers are served in rotation, FIFO each (S004-531)", async () => {
    const effects = await effectsFile();
    const { pool } = makePool({ size: { maxRunners: 1, turnsPerRunner: 1 } });
    const runs: Promise<unknown>[] = [];
    for (const [channel, count] of [
      ["a", 4],
      ["b", 2],
      ["c", 3],
    ] as const) {
      for (let i = 1; i <= count; i++) {
        runs.push(
          pool.runTurn(
            turn({
              channelId: channel,
              script: [{ kind: "appendFile", path: effects.path, line: `${channel}${i}` }],
            }),
          ),
        );
      }
    }
    await Promise.all(runs);
    expect(await effects.lines()).toEqual(["a1", "b1", "c1", "a2", "b2", "c2", "a3", "c3", "a4"]);
  });

  it("abortChannel removes a channel's queued turns with DelegationAbortedError; they never run", async () => {
    const effects = await effectsFile();
    const { pool } = makePool();
    const running = pool.runTurn(
      turn({
        channelId: "keep",
        script: [
          { kind: "wait", ms: 300 },
          { kind: "appendFile", path: effects.path, line: "keep" },
        ],
      }),
    );
    const doomed = [1, 2].map((i) =>
      pool
        .runTurn(
          turn({
            channelId: "doomed",
            sessionId: `d${i}`,
            script: [{ kind: "appendFile", path: effects.path, line: `doomed${i}` }],
          }),
        )
        .catch((e: unknown) => e),
    );
    expect(pool.abortChannel("doomed")).toBe(2);
    for (const d of doomed) expect(await d).toBeInstanceOf(DelegationAbortedError);
    expect(pool.sessionState("d1")).toBeUndefined();
    await running;
    expect(await effects.lines()).toEqual(["keep"]);
  });

  it("a memory-derived zero capacity stays runner mode and refuses admission (S004-519)", async () => {
    const { pool, events } = makePool({
      size: { maxRunners: 4, memoryBudgetBytes: 100, runnerMemoryBytes: 1_000 },
    });
    expect(pool.usable()).toBe(true);
    const error = await pool.runTurn(turn()).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunnerUnavailableError);
    expect((error as RunnerUnavailableError).reason).toBe("no_capacity");
    expect(events.filter((e) => e.type === "runner_ready")).toHaveLength(0);
    expect(pool.health()).toMatchObject({ mode: "runner", effectiveRunners: 0 });
  });

  it("nested child turns count toward placement; S004-494: only when parent and child share a runner (S004-493)", async () => {
    const { pool, events } = makePool({ size: { maxRunners: 2, turnsPerRunner: 3 } });
    const parent = pool.runTurn(turn({ sessionId: "parent", script: [{ kind: "wait", ms: 500 }] }));
    await waitFor(() => pool.sessionState("parent") === "running");
    const child = pool.runTurn(
      turn({ sessionId: "child", parentSessionId: "parent", script: [{ kind: "wait", ms: 200 }] }),
    );
    await waitFor(() => pool.sessionState("child") === "running");
    expect(pool.routeOf("child")).toBe(pool.routeOf("parent"));
    expect(pool.health()).toMatchObject({ turns: 2, nestedTurns: 1 });
    // A child whose parent is not routed anywhere is not a nested edge.
    const orphan = pool.runTurn(turn({ sessionId: "orphan", parentSessionId: "elsewhere", script: [] }));
    await Promise.all([parent, child, orphan]);
    const dispatched = events.filter((e) => e.type === "turn_dispatched");
    expect(dispatched.map((e) => e.type === "turn_dispatched" && e.nested)).toEqual([false, true, false]);
    expect(pool.health().nestedTurns).toBe(0);
  });

  it("health turn, session and nested counts come from the pool's own placement bookkeeping (S004-489)", async () => {
    const { pool } = makePool({ size: { maxRunners: 1, turnsPerRunner: 2 } });
    const a = pool.runTurn(turn({ sessionId: "h1", script: [{ kind: "wait", ms: 300 }] }));
    const b = pool.runTurn(turn({ sessionId: "h2", script: [{ kind: "wait", ms: 300 }] }));
    await waitFor(() => pool.health().turns === 2);
    expect(pool.health()).toMatchObject({ turns: 2, sessions: 2, queued: 0 });
    await Promise.all([a, b]);
    expect(pool.health()).toMatchObject({ turns: 0, sessions: 2 });
  });
});

describe("routing and release", () => {
  it("a runner that fails to release a session keeps its route; the pool does not retire it (S004-526)", async () => {
    const { pool } = makePool(standInRunner);
    await pool.runTurn(turn({ sessionId: "f1" }));
    const routed = pool.routeOf("f1");
    expect(routed).toBeDefined();
    expect(await pool.release("f1")).toBe("failed");
    expect(pool.routeOf("f1")).toBe(routed);
  });

  it("a busy release keeps the route; a released session's route is retired (S004-526)", async () => {
    const { pool } = makePool();
    const running = pool.runTurn(turn({ sessionId: "r1", script: [{ kind: "wait", ms: 300 }] }));
    await waitFor(() => pool.sessionState("r1") === "running");
    const routed = pool.routeOf("r1");
    expect(routed).toBeDefined();
    expect(await pool.release("r1")).toBe("busy");
    expect(pool.routeOf("r1")).toBe(routed);
    await running;
    expect(await pool.release("r1")).toBe("released");
    expect(pool.routeOf("r1")).toBeUndefined();
  });

  it("a runner killed mid-turn fails that turn at once; the next runner never replays it (S004-523 S004-477)", async () => {
    const effects = await effectsFile();
    const { pool, events } = makePool();
    const doomed = pool
      .runTurn(
        turn({
          sessionId: "k1",
          script: [
            { kind: "appendFile", path: effects.path, line: "k1" },
            { kind: "wait", ms: 60_000 },
          ],
        }),
      )
      .catch((e: unknown) => e);
    await waitFor(() => pool.sessionState("k1") === "running");
    await waitFor(async () => (await effects.lines()).length === 1);
    // Kill the runner process for real.
    expect(pool.routeOf("k1")).toBeDefined();
    expect(await killChildRunners()).toBe(1);
    const error = await doomed;
    expect(error).toBeInstanceOf(RunnerExitedError);
    expect(pool.routeOf("k1")).toBeUndefined();
    // A later turn gets a fresh runner; the failed one is not run again.
    const next = await pool.runTurn(
      turn({ sessionId: "k2", script: [{ kind: "appendFile", path: effects.path, line: "k2" }] }),
    );
    expect(next.stopReason).toBe("end");
    expect(await effects.lines()).toEqual(["k1", "k2"]);
    expect(events.filter((e) => e.type === "turn_dispatched")).toHaveLength(2);
  });
});
