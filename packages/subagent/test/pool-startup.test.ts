import { copyFile, cp, mkdir, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { MemoryRetryPolicySource, RunnerStartupCancelledError, RunnerStartupError } from "@crw/subagent";
import { afterEach, describe, expect, it } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { RUNNER_ENTRY, turn, waitFor } from "./support/runners.js";

closePoolsAfterEach();

const noRetries = () =>
  new MemoryRetryPolicySource({ revision: 1, maxRetries: 0, initialDelayMs: 0, multiplier: 1 });
const categories = (events: ReturnType<typeof makePool>["events"]) =>
  events.flatMap((e) => (e.type === "startup_failed" ? [e.category] : []));

// A copy of the built runner under dist/ (so its npm imports resolve), which a test may replace.
const copies: string[] = [];
afterEach(async () => {
  for (const dir of copies.splice(0)) await rm(dir, { recursive: true, force: true });
});
async function runnerCopy(): Promise<string> {
  const dir = join(dirname(RUNNER_ENTRY), `pool-startup-${process.pid}-${Date.now()}`);
  copies.push(dir);
  await mkdir(dir, { recursive: true });
  await cp(join(dirname(RUNNER_ENTRY), "runner-chunks"), join(dir, "runner-chunks"), { recursive: true });
  const entry = join(dir, "runner.js");
  await copyFile(RUNNER_ENTRY, entry);
  return entry;
}

describe("the startup episode's progress and the fork's options", () => {
  it("health shows the attempt being started, then nothing once the runner is ready", async () => {
    const { pool, events } = makePool();
    const run = pool.runTurn(turn());
    await waitFor(() => pool.health().startupRetry !== null);
    expect(pool.health().startupRetry).toEqual({
      attempt: 0,
      maxRetries: 2,
      state: "starting",
      nextDelayMs: null,
    });
    await run;
    expect(pool.health()).toMatchObject({ startupRetry: null, spawnFailure: null });
    expect(events.filter((e) => e.type === "runner_ready")).toEqual([
      { type: "runner_ready", runnerId: "runner-1" },
    ]);
  });

  it("a node binary that does not exist is a fork failure", async () => {
    const { pool, events } = makePool({ execPath: "/nonexistent/node", retryPolicySource: noRetries });
    const error = await pool.runTurn(turn()).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunnerStartupError);
    expect(error).toMatchObject({ category: "fork_failed" });
    expect(categories(events)).toEqual(["fork_failed"]);
    expect(pool.health().spawnFailure).toEqual({ category: "fork_failed", state: "exhausted" });
  });

  it("the pool's node flags reach the fork: a preload that does not exist fails the boot", async () => {
    const { pool, events } = makePool({
      execArgv: ["--require", "/nonexistent/preload.cjs"],
      retryPolicySource: noRetries,
    });
    const error = await pool.runTurn(turn()).catch((e: unknown) => e);
    expect(error).toMatchObject({ name: "RunnerStartupError", category: "boot_failed" });
    expect(categories(events)).toEqual(["boot_failed"]);
  });

  it("the pool's heartbeat interval and process root reach its runners", async () => {
    const { pool, events } = makePool({ heartbeatIntervalMs: 50, procRoot: "/nonexistent-proc" });
    await pool.runTurn(turn());
    // The runner's default interval is 5 s: a measurement within 2 s proves the pool's 50 ms reached it,
    // and it fails because it reads the pool's process root.
    await waitFor(() => events.some((e) => e.type === "measure_failed"), 2_000);
    expect(events.find((e) => e.type === "measure_failed")).toMatchObject({ runnerId: "runner-1" });
  });

  it("a reset while the episode reads its policy cancels it before any fork", async () => {
    const { pool, events } = makePool();
    const run = pool.runTurn(turn()).catch((e: unknown) => e);
    await pool.reset();
    const error = await run;
    expect(error).toBeInstanceOf(RunnerStartupCancelledError);
    expect((error as Error).message).toBe("runner startup cancelled by reset");
    expect(categories(events)).toEqual([]);
    expect(pool.health().spawnFailure).toEqual({ category: "cancelled", state: "cancelled" });
  });
});

describe("a startup that fails", () => {
  it("while a runner lives: queued turns wait for that runner, admission stays open, no new episode", async () => {
    const entry = await runnerCopy();
    const { pool, events } = makePool({
      size: { maxRunners: 2, turnsPerRunner: 1 },
      entry,
      buildId: undefined,
      retryPolicySource: noRetries,
    });
    await pool.runTurn(turn({ sessionId: "first" }));
    // The runner file on disk can no longer start: the next episode fails.
    await writeFile(entry, "process.exit(3);\n");
    // Busy long enough for the failed episode to be seen while b waits: on a loaded machine the failing
    // runner's spawn and exit took longer than 800 ms, and b had the runner by then.
    const busy = pool.runTurn(turn({ sessionId: "a", script: [{ kind: "wait", ms: 3_000 }] }));
    const queued = pool.runTurn(
      turn({ sessionId: "b", channelId: "ch-b", script: [{ kind: "text", text: "B" }] }),
    );
    await waitFor(() => categories(events).length === 1);
    expect(pool.health()).toMatchObject({
      spawnFailure: { category: "boot_failed", state: "exhausted" },
      queued: 1,
    });
    expect((await queued).text).toBe("B");
    expect(pool.routeOf("b")).toBe("runner-1");
    await busy;
    expect((await pool.runTurn(turn({ sessionId: "c" }))).stopReason).toBe("end");
    expect(categories(events)).toEqual(["boot_failed"]);
    expect(pool.health().runners.map((r) => r.runnerId)).toEqual(["runner-1"]);
  });

  it("with an unexpected error (an unreadable runner file): the turn gets it as it is, and nothing latches", async () => {
    const entry = await runnerCopy();
    const missing = join(dirname(entry), "later", "runner.js");
    const { pool, events } = makePool({ entry: missing, buildId: undefined, retryPolicySource: noRetries });
    const error = await pool.runTurn(turn()).catch((e: unknown) => e);
    expect(error).not.toBeInstanceOf(RunnerStartupError);
    expect(error).toMatchObject({ code: "ENOENT" });
    expect(categories(events)).toEqual([]);
    expect(pool.health()).toMatchObject({ spawnFailure: null, restartRequired: false, startupRetry: null });
    // The file appears: the next turn starts a runner (the failure was not terminal).
    await mkdir(dirname(missing), { recursive: true });
    await cp(join(dirname(entry), "runner-chunks"), join(dirname(missing), "runner-chunks"), {
      recursive: true,
    });
    await copyFile(entry, missing);
    expect((await pool.runTurn(turn())).stopReason).toBe("end");
  });

  it("an unexpected error inside a runner's startup reaches the turn as it is: no startup category, no retry (S004-521)", async () => {
    const boom = new TypeError("policy table is corrupt");
    let reads = 0;
    // the episode's own read pins the policy; the runner's startup reads it again and meets the error
    const source = {
      read: async () => {
        reads++;
        if (reads > 1) throw boom;
        return { revision: 1, maxRetries: 2, initialDelayMs: 0, multiplier: 1 };
      },
      subscribe: () => () => {},
    };
    const { pool, events } = makePool({ retryPolicySource: () => source });
    const error = await pool.runTurn(turn()).catch((e: unknown) => e);
    expect(error).toBe(boom);
    expect(reads).toBe(2); // one startup attempt: an unexpected error is not retried
    expect(categories(events)).toEqual([]);
    expect(pool.health()).toMatchObject({ spawnFailure: null, restartRequired: false });
  });

  it("on a build mismatch with no alert sink attached: nothing is reported as a failed alert", async () => {
    const { pool, events } = makePool({ buildId: "crw-runner-not-this-one" });
    await expect(pool.runTurn(turn())).rejects.toMatchObject({ category: "build_mismatch" });
    await new Promise((r) => setTimeout(r, 50));
    expect(events.filter((e) => e.type === "alert_failed")).toEqual([]);
    expect(categories(events)).toEqual(["build_mismatch"]);
  });

  it("on a build mismatch whose alert cannot be stored: the failure is reported with its message", async () => {
    const { pool, events } = makePool({ buildId: "crw-runner-not-this-one" });
    pool.attachRestartRequiredSink(async () => {
      throw new Error("alerts table unavailable");
    });
    await expect(pool.runTurn(turn())).rejects.toMatchObject({ category: "build_mismatch" });
    await waitFor(() => events.some((e) => e.type === "alert_failed"));
    expect(events.filter((e) => e.type === "alert_failed")).toEqual([
      { type: "alert_failed", error: "alerts table unavailable" },
    ]);
  });
});
