import type { ChildProcess } from "node:child_process";
import {
  LateBoundRetryPolicySource,
  MemoryRetryPolicySource,
  type RetryPolicy,
  RetryPolicyMirror,
  type RetryPolicySource,
  RetryPolicyUnavailableError,
  STARTUP_RETRY_CAP_MS,
  SubagentRunnerHost,
  startupRetryDelayMs,
} from "@crw/subagent";
import { afterEach, describe, expect, it } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { hostDeps, startHost, turn, waitFor } from "./support/runners.js";

closePoolsAfterEach();
const policy = (revision: number, maxRetries = 1): RetryPolicy => ({
  revision,
  maxRetries,
  initialDelayMs: 10,
  multiplier: 2,
});

describe("retry policy sources", () => {
  it("startup delays are deterministic exponential backoff capped at 60000 ms (S004-465)", () => {
    const p = { revision: 1, maxRetries: 10, initialDelayMs: 1_000, multiplier: 2 };
    expect([1, 2, 3, 4, 5, 6, 7, 8].map((n) => startupRetryDelayMs(p, n))).toEqual([
      1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000,
    ]);
    expect(STARTUP_RETRY_CAP_MS).toBe(60_000);
    expect(startupRetryDelayMs(p, 3)).toBe(startupRetryDelayMs(p, 3));
    expect(() => startupRetryDelayMs(p, 0)).toThrow(RangeError);
  });

  it("reading the late-bound policy source before construction fails instead of supplying a default", async () => {
    const late = new LateBoundRetryPolicySource();
    expect(() => late.get()).toThrow(RetryPolicyUnavailableError);
    expect(() => late.read()).toThrow(/before construction/);
    late.bind(new MemoryRetryPolicySource(policy(4)));
    expect((await late.read()).revision).toBe(4);
    expect(() => late.bind(new MemoryRetryPolicySource(policy(1)))).toThrow(/already bound/);
  });

  it("the daemon's one source reaches runner hosts through the pool's late-bound getter (S004-453)", async () => {
    const late = new LateBoundRetryPolicySource();
    const { pool } = makePool({ retryPolicySource: () => late.get() });
    // Bootstrap binds the source after constructing the pool; only then does work need it.
    const source = new MemoryRetryPolicySource(policy(9));
    late.bind(source);
    expect((await pool.runTurn(turn())).stopReason).toBe("end");
    // The live runner's host follows that very source (its one subscription), not a copy or a default.
    expect(source.listenerCount).toBe(1);
  });

  it("strictly older or duplicate revisions cannot rewind the mirror (S004-460)", async () => {
    const mirror = new RetryPolicyMirror(policy(5));
    const seen: number[] = [];
    mirror.subscribe((p) => seen.push(p.revision));
    expect(mirror.update(policy(4, 9))).toBe(false);
    expect(mirror.update(policy(5, 9))).toBe(false);
    expect((await mirror.read()).maxRetries).toBe(1);
    expect(mirror.update(policy(6, 3))).toBe(true);
    expect(mirror.update(policy(5, 9))).toBe(false);
    expect(await mirror.read()).toEqual(policy(6, 3));
    expect(seen).toEqual([6]);
  });

  it("reads and subscriptions after mirror disposal reject (S004-462)", async () => {
    const mirror = new RetryPolicyMirror(policy(1));
    mirror.dispose();
    await expect(mirror.read()).rejects.toBeInstanceOf(RetryPolicyUnavailableError);
    expect(() => mirror.subscribe(() => {})).toThrow(RetryPolicyUnavailableError);
    expect(mirror.update(policy(2))).toBe(false);
  });
});

describe("policy reaching a real runner", () => {
  const hosts: SubagentRunnerHost[] = [];
  afterEach(async () => {
    await Promise.all(hosts.splice(0).map((h) => h.shutdown(1_000)));
  });

  it("a revision committed while the initial read is in flight wins over the older snapshot (S004-455)", async () => {
    const listeners = new Set<(p: RetryPolicy) => void>();
    const racing: RetryPolicySource = {
      // The snapshot read returns revision 2, but revision 3 is committed while it is in flight.
      read: async () => {
        for (const l of listeners) l(policy(3));
        return policy(2);
      },
      subscribe: (l) => {
        listeners.add(l);
        return () => listeners.delete(l);
      },
    };
    const { deps } = hostDeps({ retryPolicySource: racing });
    const host = await SubagentRunnerHost.start(deps);
    hosts.push(host);
    expect(host.bootPolicyRevision).toBe(3);
    expect(listeners.size).toBe(1);
  });

  it("a live host sends its runner only later policy revisions, each once, and reads its source no more after boot (S004-480)", async () => {
    const source = new MemoryRetryPolicySource(policy(1));
    let reads = 0;
    const counted: RetryPolicySource = {
      read: () => {
        reads++;
        return source.read();
      },
      subscribe: (listener) => source.subscribe(listener),
    };
    const { host, events } = await startHost({ retryPolicySource: counted, heartbeatIntervalMs: 50 });
    hosts.push(host);
    const child = (host as unknown as { child: ChildProcess }).child;
    const sent: number[] = [];
    const send = child.send.bind(child);
    child.send = ((frame: { type: string; retryPolicy?: RetryPolicy }, ...rest: never[]) => {
      if (frame.type === "retryPolicyChanged") sent.push(frame.retryPolicy?.revision ?? -1);
      return send(frame, ...rest);
    }) as typeof child.send;
    source.commit({ maxRetries: 3, initialDelayMs: 10, multiplier: 2 });
    host.policyChanged(policy(2, 3));
    host.policyChanged(policy(1));
    source.commit({ maxRetries: 4, initialDelayMs: 10, multiplier: 2 });
    expect(sent).toEqual([2, 3]);
    // A few heartbeats later the boot read is still the only one: no poller reads the source.
    await waitFor(() => events.filter((e) => e.type === "heartbeat").length >= 4);
    expect(reads).toBe(1);
  });

  it("one source subscription per live host, removed when the runner exits (S004-480)", async () => {
    const source = new MemoryRetryPolicySource(policy(1));
    const a = await SubagentRunnerHost.start(hostDeps({ retryPolicySource: source }).deps);
    const b = await SubagentRunnerHost.start(hostDeps({ retryPolicySource: source }).deps);
    expect(source.listenerCount).toBe(2);
    a.kill();
    await a.exited;
    expect(source.listenerCount).toBe(1);
    await b.shutdown();
    expect(source.listenerCount).toBe(0);
  });
});
