import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import {
  HEARTBEAT_INTERVAL_MS,
  MEASURE_FAILED_TEXT,
  RemoteTurnError,
  RunnerExitedError,
  RunnerStartupError,
  SubagentRunnerHost,
  TAP_TIMEOUT_TEXT,
  TapTimeoutError,
} from "@crw/subagent";
import { afterAll, afterEach, describe, expect, it, onTestFinished } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { hostDeps, policySource, standInRunner, startHost, turn, waitFor } from "./support/runners.js";
import { tempDir } from "./support/tmp.js";

const hosts: SubagentRunnerHost[] = [];
afterEach(async () => {
  await Promise.all(hosts.splice(0).map((h) => h.shutdown(1_000)));
});
/** One plain runner shared by the tests that neither configure nor kill theirs (each uses its own sessions). */
let sharedHost: Promise<{ host: SubagentRunnerHost }> | undefined;
function shared() {
  sharedHost ??= startHost();
  return sharedHost;
}
afterAll(async () => {
  if (sharedHost) await (await sharedHost).host.shutdown(1_000);
});

async function ready(overrides: Parameters<typeof startHost>[0] = {}) {
  const started = await startHost(overrides);
  hosts.push(started.host);
  return started;
}

describe("SubagentRunnerHost handshake (real forked runner)", () => {
  it("one host is one fork + handshake that reaches ready and runs a scripted turn (S004-463)", async () => {
    const { host } = await shared();
    expect(host.isReady).toBe(true);
    expect(host.pid).toBeGreaterThan(0);
    expect(host.pid).not.toBe(process.pid);
    const result = await host.runTurn(
      turn({
        script: [
          { kind: "text", text: "hello " },
          { kind: "text", text: "world" },
        ],
      }),
    );
    expect(result).toMatchObject({ text: "hello world", stopReason: "end" });
  });

  it("a host that cannot start its runner makes exactly one fork: retrying is not its job (S004-463)", async () => {
    const forks = join(tempDir("forks"), "forks.log");
    const { deps } = hostDeps({
      ...standInRunner,
      env: { ...standInRunner.env, CRW_STANDIN_FORKS: forks, CRW_STANDIN_EXIT: "1" },
    });
    await expect(SubagentRunnerHost.start(deps)).rejects.toMatchObject({ category: "boot_failed" });
    expect((await readFile(forks, "utf8")).split("\n").filter(Boolean)).toHaveLength(1);
  });

  it("the build handshake refuses a cross-build daemon/runner pair (S004-458)", async () => {
    const { deps } = hostDeps({ buildId: "crw-runner-some-other-build" });
    const error = await SubagentRunnerHost.start(deps).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunnerStartupError);
    expect((error as RunnerStartupError).category).toBe("build_mismatch");
    expect((error as RunnerStartupError).retryable).toBe(false);
  });

  it("a runner that never says hello fails with boot_timeout and is killed (S004-520)", async () => {
    const { deps } = hostDeps({ bootTimeoutMs: 1_500, env: { CRW_RUNNER_FAULT: "hang-before-hello" } });
    const error = await SubagentRunnerHost.start(deps).catch((e: unknown) => e);
    expect(error).toMatchObject({ name: "RunnerStartupError", category: "boot_timeout" });
  });

  it("a runner that exits during startup fails with boot_failed (S004-520)", async () => {
    const { deps } = hostDeps({ env: { CRW_RUNNER_FAULT: "exit-before-hello" } });
    await expect(SubagentRunnerHost.start(deps)).rejects.toMatchObject({ category: "boot_failed" });
    const refused = hostDeps({ env: { CRW_RUNNER_FAULT: "fail-boot" } });
    await expect(SubagentRunnerHost.start(refused.deps)).rejects.toMatchObject({ category: "boot_failed" });
  });

  it("a node binary that cannot be started fails with fork_failed (S004-520)", async () => {
    const { deps } = hostDeps({ execPath: "/nonexistent/node" });
    await expect(SubagentRunnerHost.start(deps)).rejects.toMatchObject({ category: "fork_failed" });
  });

  it("the pool keeps each startup category for its health and for the turn it refuses (S004-520)", async () => {
    const noRetries = () => policySource(0);
    const cases = [
      { category: "fork_failed", pool: { execPath: "/nonexistent/node" }, state: "exhausted" },
      { category: "boot_failed", pool: { env: { CRW_RUNNER_FAULT: "fail-boot" } }, state: "exhausted" },
      { category: "build_mismatch", pool: { buildId: "crw-runner-some-other-build" }, state: "latched" },
      {
        category: "boot_timeout",
        pool: { bootTimeoutMs: 1_500, env: { CRW_RUNNER_FAULT: "hang-before-hello" } },
        state: "exhausted",
      },
    ] as const;
    for (const c of cases) {
      const { pool } = makePool({ ...c.pool, retryPolicySource: noRetries });
      onTestFinished(() => pool.close());
      const refused = await pool.runTurn(turn()).catch((e: unknown) => e);
      expect(refused).toMatchObject({ name: "RunnerStartupError", category: c.category });
      expect(pool.health().spawnFailure).toEqual({ category: c.category, state: c.state });
      // A later turn is refused up front with the same category.
      await expect(pool.runTurn(turn())).rejects.toMatchObject({ category: c.category });
    }
  });

  it("an unexpected error while reading the policy propagates unchanged, not as a startup category (S004-521)", async () => {
    const boom = new TypeError("policy table is corrupt");
    const { deps } = hostDeps({
      retryPolicySource: { read: async () => Promise.reject(boom), subscribe: () => () => {} },
    });
    await expect(SubagentRunnerHost.start(deps)).rejects.toBe(boom);
  });

  it("malformed and hostile frames from a runner are refused and logged, never acted on (S004-151)", async () => {
    const { host, events } = await ready({ env: { CRW_RUNNER_FAULT: "garbage-before-hello" } });
    expect(host.isReady).toBe(true);
    const refused = events.filter((e) => e.type === "frame_refused");
    expect(refused.length).toBeGreaterThanOrEqual(2);
    expect((await host.runTurn(turn({ prompt: "x" }))).stopReason).toBe("end");
  });

  it("a lifetime replaced before fork or before ready rejects the attempt (S004-476)", async () => {
    // Replaced before the fork: no process is started at all.
    const forks = join(tempDir("forks"), "forks.log");
    const before = hostDeps({
      ...standInRunner,
      env: { ...standInRunner.env, CRW_STANDIN_FORKS: forks },
      isCurrent: () => false,
    });
    await expect(SubagentRunnerHost.start(before.deps)).rejects.toMatchObject({
      name: "RunnerStartupCancelledError",
    });
    await expect(readFile(forks, "utf8")).rejects.toMatchObject({ code: "ENOENT" });
    let current = true;
    const after = hostDeps({
      isCurrent: () => {
        const was = current;
        current = false; // the first check (before fork) passes, the one after ready does not
        return was;
      },
    });
    await expect(SubagentRunnerHost.start(after.deps)).rejects.toMatchObject({
      name: "RunnerStartupCancelledError",
    });
  });
});

describe("SubagentRunnerHost lifecycle", () => {
  it("a runner killed mid-turn rejects its caller at once with a typed error and runs nothing again", async () => {
    const dir = tempDir("kill");
    const marker = join(dir, "effects.log");
    const { host } = await ready();
    const request = turn({
      script: [
        { kind: "appendFile", path: marker, line: "started" },
        { kind: "wait", ms: 60_000 },
        { kind: "appendFile", path: marker, line: "finished" },
      ],
    });
    const running = host.runTurn(request);
    await waitFor(() => host.activeTurns === 1);
    await waitFor(() => {
      try {
        return readFileSync(marker, "utf8").includes("started");
      } catch {
        return false;
      }
    });
    process.kill(host.pid as number, "SIGKILL");
    const error = await running.catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunnerExitedError);
    expect((error as RunnerExitedError).exit.signal).toBe("SIGKILL");
    expect((error as RunnerExitedError).retryable).toBe(false);
    expect(host.isReady).toBe(false);
    await expect(host.runTurn(turn())).rejects.toBeInstanceOf(RunnerExitedError);
    expect(await readFile(marker, "utf8")).toBe("started\n");
  });

  it("release waits for the runner's answer: busy while a turn runs, released when idle (S004-524)", async () => {
    const { host } = await shared();
    const sessionId = "s-release";
    const running = host.runTurn(
      turn({
        sessionId,
        script: [
          { kind: "wait", ms: 400 },
          { kind: "text", text: "ok" },
        ],
      }),
    );
    await waitFor(() => host.activeTurns === 1);
    expect(await host.release(sessionId)).toBe("busy");
    await running;
    expect(await host.release(sessionId)).toBe("released");
  });

  it("release has no deadline: a runner that answers only after seconds, with a failure, is waited for (S004-524)", async () => {
    const { host } = await ready({
      ...standInRunner,
      env: { ...standInRunner.env, CRW_STANDIN_RELEASE_MS: "2500" },
    });
    const started = Date.now();
    expect(await host.release("s-slow")).toBe("failed");
    expect(Date.now() - started).toBeGreaterThanOrEqual(2_400);
  });

  it("runner exit resolves a pending release as released; a release after exit is released (S004-525)", async () => {
    const { host } = await ready({ env: { CRW_RUNNER_FAULT: "stall-tap" } });
    const running = host
      .runTurn(turn({ sessionId: "s1", script: [{ kind: "wait", ms: 60_000 }] }))
      .catch((e) => e);
    await waitFor(() => host.activeTurns === 1);
    host.kill();
    expect(await host.release("s1")).toBe("released");
    expect(await running).toBeInstanceOf(RunnerExitedError);
    expect(await host.release("s1")).toBe("released");
    // A channel that is gone while the runner has not exited yet: nothing can be posted, so released too.
    const other = await ready();
    await other.host.runTurn(turn({ sessionId: "s2" }));
    (other.host as unknown as { child: import("node:child_process").ChildProcess }).child.disconnect();
    expect(other.host.isReady).toBe(true);
    expect(await other.host.release("s2")).toBe("released");
  });

  it("a failed turn comes back as a typed error with the runner's name and code", async () => {
    const { host } = await shared();
    const error = await host
      .runTurn(turn({ script: [{ kind: "fail", message: "nope", code: "model_refused" }] }))
      .catch((e) => e);
    expect(error).toBeInstanceOf(RemoteTurnError);
    expect((error as RemoteTurnError).remote).toEqual({
      name: "ScriptedTurnError",
      code: "model_refused",
      message: "nope",
    });
    expect((await host.runTurn(turn())).stopReason).toBe("end");
  });

  it("aborting a running turn stops it in the runner", async () => {
    const { host } = await shared();
    const controller = new AbortController();
    const running = host.runTurn(
      turn({
        script: [
          { kind: "text", text: "a" },
          { kind: "wait", ms: 60_000 },
        ],
      }),
      {
        signal: controller.signal,
      },
    );
    await waitFor(() => host.activeTurns === 1);
    controller.abort();
    expect(await running).toMatchObject({ stopReason: "aborted", text: "a" });
  });
});

describe("heartbeat", () => {
  it("the heartbeat carries event-loop p99, RSS and counts (S004-488)", async () => {
    const { host, events } = await ready({ heartbeatIntervalMs: 100 });
    expect(host.stats().load).toBeUndefined();
    await waitFor(() => events.some((e) => e.type === "heartbeat"));
    const load = host.stats().load;
    expect(load?.rssBytes).toBeGreaterThan(1_000_000);
    // A measured delay, not a placeholder: the runner's loop is sampled every 10 ms, so it is never 0.
    expect(load?.eventLoopP99Ms).toBeGreaterThan(0);
    expect(load?.memory.complete).toBe(true);
    expect(load?.memory.rssBytes).toBeGreaterThanOrEqual(load?.rssBytes ? load.rssBytes * 0.5 : 0);
  });

  it("a runner started with no interval beats every HEARTBEAT_INTERVAL_MS; before its first beat no load is measured (S004-490)", async () => {
    const beats: number[] = [];
    const { host } = await ready({
      onEvent: (e) => {
        if (e.type === "heartbeat") beats.push(Date.now());
      },
    });
    const readyAt = Date.now();
    expect(host.stats().load).toBeUndefined();
    await new Promise((r) => setTimeout(r, HEARTBEAT_INTERVAL_MS - 1_000));
    expect(beats).toEqual([]);
    expect(host.stats().load).toBeUndefined();
    await waitFor(() => beats.length > 0, 4_000);
    expect((beats[0] as number) - readyAt).toBeLessThan(HEARTBEAT_INTERVAL_MS + 2_000);
    expect(host.stats().load?.rssBytes).toBeGreaterThan(0);
  }, 20_000);

  it("a heartbeat carries a complete memory measurement that counts the runner itself", async () => {
    const { host, events } = await ready({ heartbeatIntervalMs: 100 });
    await waitFor(() => events.some((e) => e.type === "heartbeat"));
    const hb = events.find((e) => e.type === "heartbeat");
    expect(hb?.type === "heartbeat" && hb.memory.processes).toBeGreaterThanOrEqual(1);
    expect(host.stats().load?.memory.complete).toBe(true);
  });

  it("a failed measurement logs the fixed text and keeps the heartbeat RSS as incomplete (S004-496)", async () => {
    const { host, events } = await ready({ heartbeatIntervalMs: 100, procRoot: "/nonexistent-proc" });
    await waitFor(() => events.some((e) => e.type === "heartbeat"));
    const failed = events.find((e) => e.type === "measure_failed");
    expect(failed).toMatchObject({ message: MEASURE_FAILED_TEXT });
    expect(MEASURE_FAILED_TEXT).toBe("could not measure runner descendants");
    const load = host.stats().load;
    expect(load?.memory).toEqual({ rssBytes: load?.rssBytes, processes: 1, complete: false });
  });
});

describe("tap", () => {
  it("a tap returns model identity and history, then forwards live events while subscribed", async () => {
    const { host } = await shared();
    const sessionId = "s-tap";
    await host.runTurn(
      turn({ sessionId, model: "scripted-1", prompt: "first", script: [{ kind: "text", text: "one" }] }),
    );
    const seen: string[] = [];
    const view = await host.tap(sessionId, (e) => seen.push(`${e.kind}:${"text" in e ? e.text : e.name}`));
    expect(view.snapshot.model).toBe("scripted-1");
    expect(view.snapshot.history.map((h) => [h.role, h.text])).toEqual([
      ["user", "first"],
      ["assistant", "one"],
    ]);
    await host.runTurn(
      turn({
        sessionId,
        script: [
          { kind: "reasoning", text: "hmm" },
          { kind: "tool", name: "Read", result: "file" },
          { kind: "text", text: "two" },
        ],
      }),
    );
    await waitFor(() => seen.length === 4);
    expect(seen).toEqual(["reasoning:hmm", "tool:Read", "tool:Read", "text:two"]);
    await view.close();
    await host.runTurn(turn({ sessionId, script: [{ kind: "text", text: "three" }] }));
    await new Promise((r) => setTimeout(r, 100));
    expect(seen).toHaveLength(4);
  });

  it("a view that subscribes mid-turn gets the live replay so far, then the rest as it happens", async () => {
    const { host } = await shared();
    const sessionId = "s-live";
    const running = host.runTurn(
      turn({
        sessionId,
        script: [
          { kind: "text", text: "first " },
          { kind: "wait", ms: 300 },
          { kind: "text", text: "second" },
        ],
      }),
    );
    await waitFor(() => host.activeTurns >= 1);
    await new Promise((r) => setTimeout(r, 100));
    const seen: string[] = [];
    const view = await host.tap(sessionId, (e) => {
      if (e.kind === "text") seen.push(e.text);
    });
    expect(view.snapshot.live.map((e) => (e.kind === "text" ? e.text : e.kind))).toEqual(["first "]);
    await running;
    await waitFor(() => seen.length === 1);
    expect(seen).toEqual(["second"]);
    await view.close();
  });

  it("a tap starts no turn; closing the view releases the tap", async () => {
    const { host } = await shared();
    const view = await host.tap("s-never-ran", () => {});
    expect(view.snapshot).toEqual({ sessionId: "s-never-ran", model: null, history: [], live: [] });
    expect(host.activeTurns).toBe(0);
    expect(host.tapCount).toBe(1);
    await view.close();
    expect(host.tapCount).toBe(0);
  });

  it("history.before pages the history by cursor", async () => {
    const { host } = await shared();
    const sessionId = "s-page";
    for (const p of ["a", "b", "c"])
      await host.runTurn(turn({ sessionId, prompt: p, script: [{ kind: "text", text: p.toUpperCase() }] }));
    const all = await host.tap(sessionId, () => {}, { limit: 100 });
    expect(all.snapshot.history.map((h) => h.text)).toEqual(["a", "A", "b", "B", "c", "C"]);
    const cursor = all.snapshot.history[4]?.id as string;
    const page = await host.tap(sessionId, () => {}, { before: cursor, limit: 2 });
    expect(page.snapshot.history.map((h) => h.text)).toEqual(["b", "B"]);
    await all.close();
    await page.close();
    await expect(host.tap(sessionId, () => {}, { before: "x".repeat(129) })).rejects.toThrow(/128/);
  });

  it("a tap waits at most two seconds, then fails with the fixed text", async () => {
    const { host } = await ready({ env: { CRW_RUNNER_FAULT: "stall-tap" } });
    const started = Date.now();
    const error = await host.tap("s", () => {}).catch((e) => e);
    expect(error).toBeInstanceOf(TapTimeoutError);
    expect((error as Error).message).toBe(TAP_TIMEOUT_TEXT);
    expect(TAP_TIMEOUT_TEXT).toBe("sub-agent runner tap timed out");
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_900);
    expect(host.tapCount).toBe(0);
  });
});

describe("retry policy over IPC", () => {
  it("a pool reset retires its idle runner and with it the runner's policy subscription (S004-461)", async () => {
    const { pool, source } = makePool();
    onTestFinished(() => pool.close());
    await pool.runTurn(turn());
    expect(source.listenerCount).toBe(1);
    await pool.reset();
    expect(source.listenerCount).toBe(0);
  });

  it("a live host holds one policy subscription and its shutdown removes it (S004-461)", async () => {
    const source = policySource();
    const { host } = await ready({ retryPolicySource: source });
    expect(source.listenerCount).toBe(1);
    source.commit({ maxRetries: 5, initialDelayMs: 10, multiplier: 3 });
    await host.shutdown(2_000);
    hosts.pop();
    expect(source.listenerCount).toBe(0);
  });
});

describe("a failed measurement in the daemon's pool", () => {
  closePoolsAfterEach();

  it("the pool passes the failed measurement on with the fixed text, and its health keeps the runner's heartbeat RSS as incomplete (S004-496)", async () => {
    const { pool, events } = makePool({ heartbeatIntervalMs: 100, procRoot: "/nonexistent-proc" });
    await pool.runTurn(turn({ script: [{ kind: "wait", ms: 300 }] }));
    await waitFor(() => events.some((e) => e.type === "measure_failed"));
    expect(events.find((e) => e.type === "measure_failed")).toMatchObject({
      message: "could not measure runner descendants",
    });
    const [runner] = pool.health().runners;
    expect(runner?.memoryComplete).toBe(false);
    expect(runner?.memoryBytes).toBeGreaterThan(1_000_000);
  });
});
