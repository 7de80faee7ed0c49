import { readdir, readFile } from "node:fs/promises";
import {
  DelegationAbortedError,
  type PoolEvent,
  type ProcessChangedSink,
  RunnerExitedError,
  RunnerUnavailableError,
} from "@crw/subagent";
import { describe, expect, it } from "vitest";
import { killChildRunners } from "./support/kill.js";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { turn, waitFor } from "./support/runners.js";

closePoolsAfterEach();

/**
 * Pids of the runner processes this test process forked, read from its threads' child lists (a short read,
 * so a poll sees a fork while it boots).
 */
async function childRunnerPids(): Promise<number[]> {
  const pids: number[] = [];
  const tasks = `/proc/${process.pid}/task`;
  for (const tid of await readdir(tasks)) {
    let children = "";
    try {
      children = await readFile(`${tasks}/${tid}/children`, "utf8");
    } catch {}
    for (const pid of children.split(" ").filter(Boolean)) {
      try {
        if ((await readFile(`/proc/${pid}/cmdline`, "utf8")).includes("runner.js")) pids.push(Number(pid));
      } catch {}
    }
  }
  return pids;
}

const wait = (ms: number) => [{ kind: "wait" as const, ms }];
const dispatchedTo = (events: ReturnType<typeof makePool>["events"], turnId: string) =>
  events.flatMap((e) => (e.type === "turn_dispatched" && e.turnId === turnId ? [e.runnerId] : []));

describe("which runner a turn leases", () => {
  it("its own routed runner first, then its parent's runner, else the least loaded (ties to the older runner)", async () => {
    const { pool, events } = makePool({ size: { maxRunners: 2, turnsPerRunner: 2 } });
    // Two held turns fill runner-1; the third needs runner-2.
    const hold = new AbortController();
    const held = ["a", "b"].map((sessionId) =>
      pool.runTurn(turn({ sessionId, script: wait(60_000) }), { signal: hold.signal }),
    );
    await waitFor(() => pool.health().turns === 2);
    await pool.runTurn(turn({ sessionId: "c", channelId: "ch-c" }));
    hold.abort();
    await Promise.all(held);
    expect([pool.routeOf("a"), pool.routeOf("b"), pool.routeOf("c")]).toEqual([
      "runner-1",
      "runner-1",
      "runner-2",
    ]);
    // Both idle now: c's turn goes back to c's runner, a child of c to its parent's runner.
    const again = turn({ sessionId: "c" });
    await pool.runTurn(again);
    expect(dispatchedTo(events, again.turnId)).toEqual(["runner-2"]);
    const child = turn({ sessionId: "c-child", parentSessionId: "c" });
    await pool.runTurn(child);
    expect(dispatchedTo(events, child.turnId)).toEqual(["runner-2"]);
    // A new session with both runners idle: the older runner.
    const fresh = turn({ sessionId: "d" });
    await pool.runTurn(fresh);
    expect(dispatchedTo(events, fresh.turnId)).toEqual(["runner-1"]);
    // With runner-1 busy, a new session goes to the less loaded runner-2.
    const busy = pool.runTurn(turn({ sessionId: "a", script: wait(600) }));
    await waitFor(() => pool.health().turns === 1);
    const light = turn({ sessionId: "e" });
    await pool.runTurn(light);
    expect(dispatchedTo(events, light.turnId)).toEqual(["runner-2"]);
    await busy;
    expect(events.filter((e) => e.type === "runner_ready")).toHaveLength(2);
  });

  it("a routed runner that is full sends the session's next turn to a free runner, and the route follows", async () => {
    const { pool, events } = makePool({ size: { maxRunners: 2, turnsPerRunner: 1 } });
    const hold = new AbortController();
    const first = pool.runTurn(turn({ sessionId: "s", script: wait(60_000) }), { signal: hold.signal });
    await waitFor(() => pool.sessionState("s") === "running");
    // o queues behind s and gets runner-2.
    await pool.runTurn(turn({ sessionId: "o", channelId: "ch-o" }));
    expect([pool.routeOf("s"), pool.routeOf("o")]).toEqual(["runner-1", "runner-2"]);
    // s's runner is still busy with s's first turn; its second turn takes o's (free) runner.
    const second = turn({ sessionId: "s" });
    await pool.runTurn(second);
    expect(dispatchedTo(events, second.turnId)).toEqual(["runner-2"]);
    expect(pool.routeOf("s")).toBe("runner-2");
    hold.abort();
    expect((await first).stopReason).toBe("aborted");
  });

  it("a child whose parent's runner is full goes to a free runner; no runner takes more than its turns", async () => {
    const events: PoolEvent[] = [];
    // Each runner's turn count as each turn is dispatched (counted before the event).
    const loads: number[][] = [];
    const { pool } = makePool({
      size: { maxRunners: 2, turnsPerRunner: 1 },
      onEvent: (e) => {
        events.push(e);
        if (e.type === "turn_dispatched") loads.push(pool.health().runners.map((r) => r.turns));
      },
    });
    const hold = new AbortController();
    const parent = pool.runTurn(turn({ sessionId: "p", script: wait(60_000) }), { signal: hold.signal });
    await waitFor(() => pool.sessionState("p") === "running");
    expect(pool.routeOf("p")).toBe("runner-1");
    // runner-1 is full with the parent's turn: the child's turn waits for runner-2 and takes it.
    const child = turn({ sessionId: "p-child", channelId: "ch-child", parentSessionId: "p" });
    await pool.runTurn(child);
    expect(pool.sessionState("p")).toBe("running");
    // Dispatched once, to runner-2, and not a nested edge (the parent is on runner-1).
    expect(events.filter((e) => e.type === "turn_dispatched" && e.turnId === child.turnId)).toEqual([
      { type: "turn_dispatched", turnId: child.turnId, runnerId: "runner-2", nested: false },
    ]);
    expect(loads).toEqual([[1], [1, 1]]);
    hold.abort();
    expect((await parent).stopReason).toBe("aborted");
  });

  it("a session with two turns in flight stays running until the last one settles", async () => {
    const { pool } = makePool({ size: { maxRunners: 1, turnsPerRunner: 2 } });
    const short = pool.runTurn(turn({ sessionId: "twice", script: wait(100) }));
    const long = pool.runTurn(turn({ sessionId: "twice", script: wait(900) }));
    await short;
    expect(pool.sessionState("twice")).toBe("running");
    expect(pool.health().turns).toBe(1);
    await long;
    expect(pool.sessionState("twice")).toBeUndefined();
    expect(pool.executionOf("twice")).toEqual({ runnerId: "runner-1", state: "idle" });
  });

  it("a session's last turn settling clears its state while another session's turn still runs", async () => {
    const { pool } = makePool({ size: { maxRunners: 1, turnsPerRunner: 2 } });
    const hold = new AbortController();
    const other = pool.runTurn(turn({ sessionId: "other", script: wait(60_000) }), { signal: hold.signal });
    await waitFor(() => pool.sessionState("other") === "running");
    await pool.runTurn(turn({ sessionId: "done", channelId: "ch-done" }));
    expect(pool.sessionState("done")).toBeUndefined();
    expect(pool.executionOf("done")).toEqual({ runnerId: "runner-1", state: "idle" });
    expect(pool.sessionState("other")).toBe("running");
    hold.abort();
    expect((await other).stopReason).toBe("aborted");
    expect(pool.sessionState("other")).toBeUndefined();
  });

  it("queued and dispatched turns are announced with their turn, channel and runner", async () => {
    const { pool, events } = makePool();
    const t = turn({ channelId: "ch-announce" });
    await pool.runTurn(t);
    expect(events.filter((e) => e.type !== "runner_log")).toEqual([
      { type: "turn_queued", turnId: t.turnId, channelId: "ch-announce" },
      { type: "runner_ready", runnerId: "runner-1" },
      { type: "turn_dispatched", turnId: t.turnId, runnerId: "runner-1", nested: false },
    ]);
  });

  it("one startup episode at a time: a second runner is forked only after the first is ready", async () => {
    const { pool, events } = makePool({ size: { maxRunners: 2, turnsPerRunner: 1 } });
    // Runners of earlier tests in this process may still be exiting: count only forks made here.
    const before = new Set(await childRunnerPids());
    // Each turn outlasts a second runner's fork and boot on a loaded machine: were the first turn over before
    // the second runner is ready, the second turn would take the first runner and no second would be made.
    const runs = [pool.runTurn(turn({ script: wait(2_000) })), pool.runTurn(turn({ script: wait(2_000) }))];
    const ready = () => events.some((e) => e.type === "runner_ready");
    let most = 0;
    while (!ready()) {
      const forked = (await childRunnerPids()).filter((p) => !before.has(p)).length;
      // a listing that ended after the first ready may hold the fork that ready allowed: not counted
      if (ready()) break;
      most = Math.max(most, forked);
      await new Promise((r) => setTimeout(r, 5));
    }
    await Promise.all(runs);
    expect(most).toBe(1);
    expect(events.filter((e) => e.type === "runner_ready")).toHaveLength(2);
  });
});

describe("aborts and refusals at admission", () => {
  it("a signal aborted before admission refuses the turn: nothing is queued or forked", async () => {
    const { pool, events } = makePool();
    const c = new AbortController();
    c.abort();
    const error = await pool
      .runTurn(turn({ channelId: "gone" }), { signal: c.signal })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(DelegationAbortedError);
    await new Promise((r) => setTimeout(r, 50));
    expect(events).toEqual([]);
    expect(pool.health()).toMatchObject({ queued: 0, runners: [], startupRetry: null });
  });

  it("aborting a queued turn's signal removes that turn only; aborting a running turn's signal stops it", async () => {
    const { pool } = makePool();
    const runningSignal = new AbortController();
    const queuedSignal = new AbortController();
    const running = pool.runTurn(turn({ sessionId: "run", script: wait(60_000) }), {
      signal: runningSignal.signal,
    });
    await waitFor(() => pool.sessionState("run") === "running");
    const doomed = pool
      .runTurn(turn({ sessionId: "q1", channelId: "ch-q" }), { signal: queuedSignal.signal })
      .catch((e: unknown) => e);
    const kept = pool.runTurn(
      turn({ sessionId: "q2", channelId: "ch-q", script: [{ kind: "text", text: "q2" }] }),
    );
    expect(pool.health().queued).toBe(2);
    queuedSignal.abort();
    expect(await doomed).toBeInstanceOf(DelegationAbortedError);
    expect(pool.sessionState("q1")).toBeUndefined();
    expect(pool.sessionState("q2")).toBe("queued");
    expect(pool.health().queued).toBe(1);
    runningSignal.abort();
    expect((await running).stopReason).toBe("aborted");
    expect((await kept).text).toBe("q2");
  });

  it("aborting a channel stops its running turns and leaves another channel's running turn alone", async () => {
    const { pool } = makePool({ size: { maxRunners: 1, turnsPerRunner: 2 } });
    const stopped = pool.runTurn(turn({ channelId: "stop-me", script: wait(60_000) }));
    const other = pool.runTurn(
      turn({ channelId: "keep-me", script: [...wait(400), { kind: "text", text: "kept" }] }),
    );
    await waitFor(() => pool.health().turns === 2);
    expect(pool.abortChannel("stop-me")).toBe(0);
    expect((await stopped).stopReason).toBe("aborted");
    expect(await other).toMatchObject({ text: "kept", stopReason: "end" });
  });

  it("a closed pool refuses its queued turns and every later turn as closed", async () => {
    const { pool } = makePool();
    const running = pool.runTurn(turn({ script: wait(300) })).catch((e: unknown) => e);
    await waitFor(() => pool.health().turns === 1);
    const queued = pool.runTurn(turn({ channelId: "late" })).catch((e: unknown) => e);
    await pool.close();
    expect(await queued).toBeInstanceOf(RunnerUnavailableError);
    expect(await queued).toMatchObject({ reason: "closed", message: "runner pool closed" });
    await expect(pool.runTurn(turn())).rejects.toMatchObject({
      name: "RunnerUnavailableError",
      reason: "closed",
      message: "runner pool closed",
    });
    await running;
  });
});

describe("a runner's exit", () => {
  it("drops the routes of that runner only, is announced once with its signal, and frees its place for a new fork", async () => {
    const { pool, events } = makePool({ size: { maxRunners: 2, turnsPerRunner: 1 } });
    const changes: Parameters<ProcessChangedSink>[0][] = [];
    pool.attachProcessChangedSink((c) => changes.push(c));
    const hold = new AbortController();
    const hold2 = new AbortController();
    const x = pool.runTurn(turn({ sessionId: "x", script: wait(60_000) }), { signal: hold.signal });
    await waitFor(() => pool.sessionState("x") === "running");
    await pool.runTurn(turn({ sessionId: "y", channelId: "ch-y" }));
    hold.abort();
    await x;
    expect([pool.routeOf("x"), pool.routeOf("y")]).toEqual(["runner-1", "runner-2"]);
    const pids = await childRunnerPids();
    expect(pids).toHaveLength(2);
    process.kill(pids[0] as number, "SIGKILL");
    await waitFor(() => events.some((e) => e.type === "runner_exited"));
    await new Promise((r) => setTimeout(r, 50));
    const exited = events.filter((e) => e.type === "runner_exited");
    expect(exited).toHaveLength(1);
    const dead = exited[0]?.type === "runner_exited" ? exited[0].runnerId : "";
    expect(exited[0]).toEqual({ type: "runner_exited", runnerId: dead, code: null, signal: "SIGKILL" });
    const alive = dead === "runner-1" ? "runner-2" : "runner-1";
    // Exactly one of x and y keeps its route: the one on the runner still alive.
    expect([pool.routeOf("x"), pool.routeOf("y")].filter((r) => r !== undefined)).toEqual([alive]);
    expect(pool.health().runners.map((r) => r.runnerId)).toEqual([alive]);
    expect(changes).toContainEqual({ runnerId: dead, state: "exited", code: null, signal: "SIGKILL" });
    expect(changes.filter((c) => c.state === "exited")).toHaveLength(1);
    // The live runner busy again: the next turn takes the dead runner's place, a new fork (runner-3).
    const busy = pool.runTurn(turn({ sessionId: "z1", script: wait(60_000) }), { signal: hold2.signal });
    await waitFor(() => pool.health().turns === 1);
    await pool.runTurn(turn({ sessionId: "z2", channelId: "ch-z2" }));
    expect(pool.routeOf("z2")).toBe("runner-3");
    expect(
      pool
        .health()
        .runners.map((r) => r.runnerId)
        .sort(),
    ).toEqual([alive, "runner-3"].sort());
    hold2.abort();
    await busy;
  });

  it("a turn queued behind a runner that dies runs on a fresh runner; the one that was running fails", async () => {
    const { pool, events } = makePool();
    const doomed = pool.runTurn(turn({ sessionId: "k", script: wait(60_000) })).catch((e: unknown) => e);
    await waitFor(() => pool.sessionState("k") === "running");
    const next = pool.runTurn(
      turn({ sessionId: "n", channelId: "ch-n", script: [{ kind: "text", text: "next" }] }),
    );
    expect(pool.sessionState("n")).toBe("queued");
    expect(await killChildRunners()).toBe(1);
    expect(await doomed).toBeInstanceOf(RunnerExitedError);
    expect((await next).text).toBe("next");
    expect(pool.routeOf("n")).toBe("runner-2");
    expect(
      events.filter((e) => e.type === "runner_ready").map((e) => e.type === "runner_ready" && e.runnerId),
    ).toEqual(["runner-1", "runner-2"]);
  });
});
