import {
  ManualClock,
  MemoryRetryPolicySource,
  RESTART_REQUIRED_ALERT_KEY,
  type RestartRequiredAlert,
  RunnerStartupError,
  restartRequiredAlert,
} from "@crw/subagent";
import { describe, expect, it } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { turn, waitFor } from "./support/runners.js";

closePoolsAfterEach();

const failingEnv = { CRW_RUNNER_FAULT: "exit-before-hello" };

function failingPool(maxRetries: number, initialDelayMs = 100, multiplier = 2) {
  const clock = new ManualClock();
  const source = new MemoryRetryPolicySource({ revision: 1, maxRetries, initialDelayMs, multiplier });
  const made = makePool({ clock, env: failingEnv, retryPolicySource: () => source });
  return { ...made, clock, source };
}

/** Drive the manual clock through every backoff wait the episode asks for. */
async function driveEpisode(clock: ManualClock, waits: number): Promise<void> {
  for (let i = 0; i < waits; i++) {
    await waitFor(() => clock.pendingSleeps === 1);
    clock.advance(clock.requested[clock.requested.length - 1] ?? 0);
  }
}

/** The retry policy these tests run under: `maxRetries` retries, 100 ms first, doubling. */
const retrySource = (maxRetries: number) =>
  new MemoryRetryPolicySource({ revision: 1, maxRetries, initialDelayMs: 100, multiplier: 2 });
describe("startup episode (real forks, controllable clock in the pool only)", () => {
  it("one serialized episode serves every waiting turn: the original attempt plus maxRetries, with exponential, deterministic waits (S004-464)", async () => {
    const { pool, events, clock } = failingPool(3);
    // Two turns wait for the same runner: they share one episode, not one each.
    const result = pool.runTurn(turn()).catch((e: unknown) => e);
    const other = pool.runTurn(turn()).catch((e: unknown) => e);
    await driveEpisode(clock, 3);
    const error = await result;
    expect(error).toBeInstanceOf(RunnerStartupError);
    expect((error as RunnerStartupError).category).toBe("boot_failed");
    expect(await other).toMatchObject({ category: "boot_failed" });
    expect(clock.requested).toEqual([100, 200, 400]);
    expect(
      events.filter((e) => e.type === "startup_failed").map((e) => e.type === "startup_failed" && e.attempt),
    ).toEqual([0, 1, 2, 3]);
  });

  it("backoff is capped at 60000 ms (S004-465)", async () => {
    const { pool, clock } = failingPool(3, 30_000, 10);
    const result = pool.runTurn(turn()).catch((e: unknown) => e);
    await driveEpisode(clock, 3);
    await result;
    expect(clock.requested).toEqual([30_000, 60_000, 60_000]);
  });

  it("health shows startupRetry progress while the episode waits, null once it ends (S004-472)", async () => {
    const { pool, clock } = failingPool(1, 5_000);
    const result = pool.runTurn(turn()).catch((e: unknown) => e);
    await waitFor(() => clock.pendingSleeps === 1);
    expect(pool.health().startupRetry).toEqual({
      attempt: 1,
      maxRetries: 1,
      state: "waiting",
      nextDelayMs: 5_000,
    });
    expect(pool.health().spawnFailure).toEqual({ category: "boot_failed", state: "retrying" });
    expect(pool.health().queued).toBe(1);
    clock.advance(5_000);
    await result;
    expect(pool.health().startupRetry).toBeNull();
    expect(pool.health().spawnFailure).toEqual({ category: "boot_failed", state: "exhausted" });
  });

  it("an exhausted startup stays terminal (finite, not an unlimited transport retry): later calls, a reset and a mode toggle are refused with the same category and fork nothing (S004-470 S004-478)", async () => {
    const clock = new ManualClock();
    const source = retrySource(0);
    let enabled = true;
    const { pool, events } = makePool({
      clock,
      env: failingEnv,
      retryPolicySource: () => source,
      enabled: () => enabled,
    });
    const first = await pool.runTurn(turn()).catch((e: unknown) => e);
    expect(first).toMatchObject({ category: "boot_failed" });
    const attempts = events.filter((e) => e.type === "startup_failed").length;
    const again = await pool.runTurn(turn()).catch((e: unknown) => e);
    expect(again).toBeInstanceOf(RunnerStartupError);
    expect((again as RunnerStartupError).category).toBe("boot_failed");
    await pool.reset();
    await expect(pool.runTurn(turn())).rejects.toMatchObject({ category: "boot_failed" });
    // The operator turns runners off and on again, as a mode toggle does (with its reset).
    enabled = false;
    await pool.reset();
    enabled = true;
    await expect(pool.runTurn(turn())).rejects.toMatchObject({ category: "boot_failed" });
    expect(events.filter((e) => e.type === "startup_failed")).toHaveLength(attempts);
    expect(clock.requested).toEqual([]);
  });

  it("spawnFailure survives a reset and a mode toggle, and clears only when a runner reaches application-ready (S004-473)", async () => {
    const clock = new ManualClock();
    const source = retrySource(1);
    const env: Record<string, string> = { ...failingEnv };
    let enabled = true;
    const { pool } = makePool({ clock, env, retryPolicySource: () => source, enabled: () => enabled });
    const first = pool.runTurn(turn());
    await waitFor(() => clock.pendingSleeps === 1);
    expect(pool.health().spawnFailure).toEqual({ category: "boot_failed", state: "retrying" });
    // A toggle while the episode waits leaves it as it is.
    enabled = false;
    enabled = true;
    expect(pool.health().spawnFailure).toEqual({ category: "boot_failed", state: "retrying" });
    delete env.CRW_RUNNER_FAULT;
    clock.advance(100);
    await first;
    expect(pool.health().spawnFailure).toBeNull();
    // An exhausted one outlives reset and toggle.
    const exhausted = failingPool(0);
    await exhausted.pool.runTurn(turn()).catch(() => {});
    await exhausted.pool.reset();
    expect(exhausted.pool.health().spawnFailure).toEqual({ category: "boot_failed", state: "exhausted" });
  });

  it("application-ready startup ends the episode; a later request is new work, with no cooldown (S004-469 S004-467)", async () => {
    const clock = new ManualClock();
    const source = retrySource(1);
    // The runners' environment is read at each fork: the fault is switched on and off between attempts.
    const env: Record<string, string> = { ...failingEnv };
    const { pool, events } = makePool({
      size: { maxRunners: 2, turnsPerRunner: 1 },
      clock,
      env,
      retryPolicySource: () => source,
    });
    const attempts = () =>
      events.flatMap(
        (e): Array<number | "ready"> =>
          e.type === "startup_failed" ? [e.attempt] : e.type === "runner_ready" ? ["ready"] : [],
      );
    // The first episode spends its one retry: attempt 0 fails, attempt 1 is application-ready.
    const first = pool.runTurn(turn());
    await waitFor(() => clock.pendingSleeps === 1);
    delete env.CRW_RUNNER_FAULT;
    clock.advance(100);
    await first;
    expect(pool.health()).toMatchObject({ startupRetry: null, spawnFailure: null });
    expect(attempts()).toEqual([0, "ready"]);
    // Two turns at once need a second runner. Were the first episode still open, its budget would be spent
    // and this failure final; as new work it starts at attempt 0 with the first delay, and its retry is ready.
    env.CRW_RUNNER_FAULT = failingEnv.CRW_RUNNER_FAULT;
    const both = Promise.all([
      pool.runTurn(turn({ script: [{ kind: "wait", ms: 200 }] })),
      pool.runTurn(turn({ script: [{ kind: "wait", ms: 200 }] })),
    ]);
    await waitFor(() => clock.pendingSleeps === 1);
    delete env.CRW_RUNNER_FAULT;
    clock.advance(100);
    await both;
    await waitFor(() => events.filter((e) => e.type === "runner_ready").length === 2);
    expect(attempts()).toEqual([0, "ready", 0, "ready"]);
    // No boot cooldown: the only waits were each episode's own first backoff.
    expect(clock.requested).toEqual([100, 100]);
    expect(pool.health().spawnFailure).toBeNull();
  });

  it("reset aborts a pending startup, and the cancelled episode stays terminal (S004-470)", async () => {
    const { pool, clock } = failingPool(5, 10_000);
    const result = pool.runTurn(turn()).catch((e: unknown) => e);
    await waitFor(() => clock.pendingSleeps === 1);
    await pool.reset();
    expect(await result).toMatchObject({ name: "RunnerStartupCancelledError" });
    expect(pool.health().spawnFailure).toEqual({ category: "cancelled", state: "cancelled" });
    await expect(pool.runTurn(turn())).rejects.toMatchObject({ name: "RunnerStartupCancelledError" });
  });

  it("the episode pins one policy revision: a revision committed mid-episode changes neither budget nor timing (S004-464)", async () => {
    const { pool, clock, source } = failingPool(2, 100);
    const result = pool.runTurn(turn()).catch((e: unknown) => e);
    await waitFor(() => clock.pendingSleeps === 1);
    // A revision committed mid-episode does not change its budget or timing.
    source.commit({ maxRetries: 10, initialDelayMs: 7, multiplier: 1 });
    clock.advance(100);
    await waitFor(() => clock.pendingSleeps === 1);
    clock.advance(200);
    await result;
    expect(clock.requested).toEqual([100, 200]);
  });
});

describe("boot deadline inside the episode", () => {
  it("a boot timeout is one attempt of the episode, not a budget of its own (S004-468)", async () => {
    const clock = new ManualClock();
    const source = new MemoryRetryPolicySource({
      revision: 1,
      maxRetries: 1,
      initialDelayMs: 50,
      multiplier: 2,
    });
    const { pool, events } = makePool({
      clock,
      bootTimeoutMs: 400,
      env: { CRW_RUNNER_FAULT: "hang-before-hello" },
      retryPolicySource: () => source,
    });
    const result = pool.runTurn(turn()).catch((e: unknown) => e);
    await driveEpisode(clock, 1);
    expect(await result).toMatchObject({ category: "boot_timeout" });
    expect(
      events.filter((e) => e.type === "startup_failed").map((e) => e.type === "startup_failed" && e.category),
    ).toEqual(["boot_timeout", "boot_timeout"]);
    expect(clock.requested).toEqual([50]);
  });

  it("room for more runners is not more retries: turns that each want a runner share one episode's budget (S004-468)", async () => {
    const clock = new ManualClock();
    const source = new MemoryRetryPolicySource({
      revision: 1,
      maxRetries: 1,
      initialDelayMs: 50,
      multiplier: 2,
    });
    const { pool, events } = makePool({
      size: { maxRunners: 3, turnsPerRunner: 1 },
      clock,
      env: failingEnv,
      retryPolicySource: () => source,
    });
    const turns = [1, 2, 3].map(() => pool.runTurn(turn()).catch((e: unknown) => e));
    await driveEpisode(clock, 1);
    for (const t of turns) expect(await t).toMatchObject({ category: "boot_failed" });
    expect(
      events.filter((e) => e.type === "startup_failed").map((e) => e.type === "startup_failed" && e.attempt),
    ).toEqual([0, 1]);
    expect(clock.requested).toEqual([50]);
  });
});

describe("build mismatch latch and restart-required alert", () => {
  it("a build mismatch latches and blocks further forks, and the restart-required sink is invoked once (S004-522 S004-164)", async () => {
    const alerts: RestartRequiredAlert[] = [];
    const clock = new ManualClock();
    const { pool, events } = makePool({ buildId: "crw-runner-older-build", clock });
    pool.attachRestartRequiredSink((a) => {
      alerts.push(a);
    });
    const error = await pool.runTurn(turn()).catch((e: unknown) => e);
    expect(error).toMatchObject({ name: "RunnerStartupError", category: "build_mismatch" });
    const again = await pool.runTurn(turn()).catch((e: unknown) => e);
    expect(again).toMatchObject({
      category: "build_mismatch",
      message: "sub-agent runners need a daemon restart (build mismatch)",
    });
    await waitFor(() => alerts.length === 1);
    await new Promise((r) => setTimeout(r, 50));
    expect(alerts).toHaveLength(1);
    // No retries for a mismatch, and no fork after the latch.
    expect(events.filter((e) => e.type === "startup_failed")).toHaveLength(1);
    expect(clock.requested).toEqual([]);
    expect(pool.health()).toMatchObject({
      restartRequired: true,
      spawnFailure: { category: "build_mismatch", state: "latched" },
    });
  });

  it("the alert is the warning core:subagent-restart-required for administrators, telling them in English, Czech and Slovak to restart the daemon (S004-166 S004-167)", () => {
    expect(restartRequiredAlert).toMatchObject({
      key: RESTART_REQUIRED_ALERT_KEY,
      severity: "warning",
      audience: "administrators",
    });
    expect(RESTART_REQUIRED_ALERT_KEY).toBe("core:subagent-restart-required");
    expect(restartRequiredAlert.text.en).toMatch(/Restart the crw daemon/);
    expect(restartRequiredAlert.text.cs).toMatch(/Restartujte/);
    expect(restartRequiredAlert.text.sk).toMatch(/Reštartujte/);
  });

  it("reset and runner-mode toggles neither clear the latch nor raise the alert again (S004-171)", async () => {
    const alerts: RestartRequiredAlert[] = [];
    let enabled = true;
    const { pool } = makePool({ buildId: "crw-runner-stale", enabled: () => enabled });
    pool.attachRestartRequiredSink((a) => {
      alerts.push(a);
    });
    await expect(pool.runTurn(turn())).rejects.toMatchObject({ category: "build_mismatch" });
    enabled = false;
    await pool.reset();
    enabled = true;
    expect(pool.health().restartRequired).toBe(true);
    await expect(pool.runTurn(turn())).rejects.toMatchObject({ category: "build_mismatch" });
    await new Promise((r) => setTimeout(r, 50));
    expect(alerts).toHaveLength(1);
  });

  it("the runner's bundle carries no pool and no alert key", async () => {
    const { readFile } = await import("node:fs/promises");
    const { runnerBuildFiles } = await import("./support/runners.js");
    // The entry and every chunk it imports after boot.
    const runnerCode = (await Promise.all(runnerBuildFiles().map((f) => readFile(f, "utf8")))).join("\n");
    expect(runnerCode).not.toContain(RESTART_REQUIRED_ALERT_KEY);
    expect(runnerCode).not.toContain("class SubagentRunnerPool");
  });

  it("startup failures other than build_mismatch never raise the restart warning (S004-172)", async () => {
    const alerts: unknown[] = [];
    const { pool, clock } = failingPool(0);
    pool.attachRestartRequiredSink((a) => {
      alerts.push(a);
    });
    await pool.runTurn(turn()).catch(() => {});
    expect(clock.requested).toEqual([]);
    expect(alerts).toEqual([]);
    expect(pool.health().restartRequired).toBe(false);
  });

  it("an alert-persistence failure is reported as an event and never replaces the startup error (S004-174)", async () => {
    const { pool, events } = makePool({ buildId: "crw-runner-other" });
    pool.attachRestartRequiredSink(async () => {
      throw new Error("alerts table unavailable");
    });
    await expect(pool.runTurn(turn())).rejects.toMatchObject({ category: "build_mismatch" });
    await waitFor(() => events.some((e) => e.type === "alert_failed"));
    expect(events.find((e) => e.type === "alert_failed")).toMatchObject({
      error: "alerts table unavailable",
    });
  });

  it("with no sink attached the startup failure stays typed, on the failing turn and later ones (S004-173)", async () => {
    const { pool } = makePool({ buildId: "crw-runner-other" });
    for (let i = 0; i < 2; i++) {
      const error = await pool.runTurn(turn()).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RunnerStartupError);
      expect(error).toMatchObject({ code: "runner_startup", category: "build_mismatch" });
    }
  });

  it("health carries typed categories only: no paths, pids or build ids (S004-474)", async () => {
    const { pool } = makePool({ buildId: "crw-runner-secret-build" });
    await pool.runTurn(turn()).catch(() => {});
    const text = JSON.stringify(pool.health());
    expect(text).not.toMatch(/crw-runner-secret-build|\/|pid/);
    // Category and state, and nothing else: no message or detail rides along.
    expect(pool.health().spawnFailure).toEqual({ category: "build_mismatch", state: "latched" });
  });
});

describe("build identity across an episode", () => {
  it("the episode captures the build identity once: a runner file replaced mid-episode is refused as skew (S004-466 S004-471)", async () => {
    const { copyFile, cp, mkdir, rm, writeFile } = await import("node:fs/promises");
    const { join, dirname } = await import("node:path");
    const { RUNNER_ENTRY } = await import("./support/runners.js");
    // Under dist/ so the copy resolves its npm imports from the workspace's node_modules.
    const dir = join(dirname(RUNNER_ENTRY), `episode-${process.pid}-${Date.now()}`);
    await mkdir(dir, { recursive: true });
    const entry = join(dir, "runner.js");
    try {
      // The build on disk when the episode starts cannot even say hello.
      await writeFile(entry, "process.exit(3);\n");
      const clock = new ManualClock();
      const source = new MemoryRetryPolicySource({
        revision: 1,
        maxRetries: 1,
        initialDelayMs: 1_000,
        multiplier: 2,
      });
      const { pool, events } = makePool({
        clock,
        entry,
        buildId: undefined,
        retryPolicySource: () => source,
      });
      const result = pool.runTurn(turn()).catch((e: unknown) => e);
      await waitFor(() => clock.pendingSleeps === 1);
      // An upgrade lands on disk between attempts: the replacement host's runner is a different build
      // (the entry and the chunks it imports after boot).
      await cp(join(dirname(RUNNER_ENTRY), "runner-chunks"), join(dir, "runner-chunks"), { recursive: true });
      await copyFile(RUNNER_ENTRY, entry);
      clock.advance(1_000);
      expect(await result).toMatchObject({ name: "RunnerStartupError", category: "build_mismatch" });
      expect(
        events
          .filter((e) => e.type === "startup_failed")
          .map((e) => e.type === "startup_failed" && e.category),
      ).toEqual(["boot_failed", "build_mismatch"]);
      // A different build needs explicit new construction: a new pool captures it afresh.
      const fresh = makePool({ entry, buildId: undefined });
      expect((await fresh.pool.runTurn(turn())).stopReason).toBe("end");
      // The old pool does not quietly probe the new build: it keeps refusing.
      await expect(pool.runTurn(turn())).rejects.toMatchObject({ category: "build_mismatch" });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
