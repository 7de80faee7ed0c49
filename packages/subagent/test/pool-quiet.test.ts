import { MemoryRetryPolicySource, type ProcessChangedSink, RunnerStartupCancelledError } from "@crw/subagent";
import { alive } from "@crw/tools/processes";
import { describe, expect, it } from "vitest";
import { killChildRunners } from "./support/kill.js";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { turn, waitFor } from "./support/runners.js";

closePoolsAfterEach();

const wait = (ms: number) => [{ kind: "wait" as const, ms }];

const noRetries = () =>
  new MemoryRetryPolicySource({ revision: 1, maxRetries: 0, initialDelayMs: 0, multiplier: 1 });

describe("a pool's optional listeners", () => {
  it("with no event listener it dispatches, adopts, sees an exit and fails a start without throwing", async () => {
    const { pool } = makePool({ onEvent: undefined });
    const changes: Parameters<ProcessChangedSink>[0][] = [];
    pool.attachProcessChangedSink((c) => changes.push(c));
    expect((await pool.runTurn(turn())).stopReason).toBe("end");
    expect(await killChildRunners()).toBe(1);
    await waitFor(() => pool.health().runners.length === 0);
    // The process sink hears of the start and the exit all the same.
    expect(changes).toEqual([
      { runnerId: "runner-1", state: "started" },
      { runnerId: "runner-1", state: "exited", code: null, signal: "SIGKILL" },
    ]);
    expect((await pool.runTurn(turn())).stopReason).toBe("end");
    const failing = makePool({
      onEvent: undefined,
      env: { CRW_RUNNER_FAULT: "exit-before-hello" },
      retryPolicySource: noRetries,
    });
    await expect(failing.pool.runTurn(turn())).rejects.toMatchObject({
      name: "RunnerStartupError",
      category: "boot_failed",
    });
  });

  it("a runner that started no process exits without a call to the exit-token sink", async () => {
    const { pool } = makePool({ heartbeatIntervalMs: 50 });
    const exits: unknown[] = [];
    pool.attachRunnerExitTokensSink((e) => exits.push(e));
    await pool.runTurn(turn());
    // Let a few heartbeats (with their containment state) arrive before the runner dies.
    await new Promise((r) => setTimeout(r, 300));
    expect(await killChildRunners()).toBe(1);
    await waitFor(() => pool.health().runners.length === 0);
    expect(exits).toEqual([]);
  });

  it("a runner whose processes have all ended exits without a call to the exit-token sink", async () => {
    const { pool } = makePool({ heartbeatIntervalMs: 50 });
    const exits: unknown[] = [];
    pool.attachRunnerExitTokensSink((e) => exits.push(e));
    await pool.runTurn(turn({ sessionId: "spawner", script: [{ kind: "spawn", command: ["true"] }] }));
    const view = await pool.tap("spawner", () => {});
    const spawned = view?.snapshot.history.find((h) => h.role === "tool" && /^\d+$/.test(h.text));
    await view?.close();
    const pid = Number(spawned?.text);
    expect(pid).toBeGreaterThan(1);
    // Gone (not a zombie): the runner has reaped it, and dropped its kill token in the same callback.
    await waitFor(() => !alive(pid));
    // A turn sent after that spans several heartbeats: one, with the state that names no process, reaches
    // the pool before the turn's reply.
    await pool.runTurn(turn({ sessionId: "spawner", script: wait(200) }));
    expect(await killChildRunners()).toBe(1);
    await waitFor(() => pool.health().runners.length === 0);
    expect(exits).toEqual([]);
  });

  it("with no event listener a failed measurement still leaves the runner's heartbeat in its health", async () => {
    const { pool } = makePool({ onEvent: undefined, heartbeatIntervalMs: 50, procRoot: "/nonexistent-proc" });
    await pool.runTurn(turn());
    await waitFor(() => pool.health().runners[0]?.memoryComplete === false);
  });

  it("with no event listener a runner's refused frames are dropped and its turn runs", async () => {
    const { pool } = makePool({ onEvent: undefined, env: { CRW_RUNNER_FAULT: "garbage-before-hello" } });
    expect((await pool.runTurn(turn())).stopReason).toBe("end");
  });

  it("with no event listener a sink that throws is passed over, at a runner's start and at its exit", async () => {
    const { pool } = makePool({ onEvent: undefined });
    let calls = 0;
    pool.attachProcessChangedSink(() => {
      calls++;
      throw new Error("process table unavailable");
    });
    expect((await pool.runTurn(turn())).stopReason).toBe("end");
    await pool.close();
    expect(calls).toBe(2);
  });

  it("with no event listener a restart-required sink that fails is passed over", async () => {
    const { pool } = makePool({ onEvent: undefined, buildId: "crw-runner-older-build" });
    let tried = false;
    pool.attachRestartRequiredSink(async () => {
      tried = true;
      throw new Error("alerts table unavailable");
    });
    await expect(pool.runTurn(turn())).rejects.toMatchObject({ category: "build_mismatch" });
    await waitFor(() => tried);
    // The failure is handled on a later tick: give it one before the test ends.
    await new Promise((r) => setTimeout(r, 50));
  });

  it("a reset while a fork boots cancels the episode; the cancellation is no failed start", async () => {
    const { pool, events } = makePool();
    const run = pool.runTurn(turn()).catch((e: unknown) => e);
    await waitFor(() => pool.health().startupRetry?.state === "starting");
    await pool.reset();
    expect(await run).toBeInstanceOf(RunnerStartupCancelledError);
    expect(events.filter((e) => e.type === "startup_failed")).toEqual([]);
    expect(pool.health().spawnFailure).toEqual({ category: "cancelled", state: "cancelled" });
  });
});
