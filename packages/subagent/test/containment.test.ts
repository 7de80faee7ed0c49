import { killContainedProcesses, type SubagentRunnerHost } from "@crw/subagent";
import { alive } from "@crw/tools/processes";
import { afterEach, describe, expect, it } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { startHost, turn, waitFor } from "./support/runners.js";

closePoolsAfterEach();
const hosts: SubagentRunnerHost[] = [];
const stray: number[] = [];
afterEach(async () => {
  await Promise.all(hosts.splice(0).map((h) => h.shutdown(1_000)));
  killContainedProcesses(stray.splice(0).map((pid) => `pgid:${pid}`));
});

describe("runner process containment", () => {
  it("the heartbeat's memory figure covers the runner's whole process tree (S004-495)", async () => {
    const { host } = await startHost({ heartbeatIntervalMs: 100 });
    hosts.push(host);
    const result = await host.runTurn(turn({ script: [{ kind: "spawn", command: ["sleep", "30"] }] }));
    expect(result.stopReason).toBe("end");
    await waitFor(() => (host.stats().load?.memory.processes ?? 0) >= 2);
    const load = host.stats().load;
    expect(load?.memory.complete).toBe(true);
    expect(load?.memory.rssBytes).toBeGreaterThan(load?.rssBytes ?? 0);
    stray.push(...(host.containment?.killTokens ?? []).map((t) => Number(t.slice(5))));
  });

  it("the newest kill-token state survives the runner's death and cleans up its processes", async () => {
    const exits: { runnerId: string; killTokens: readonly string[] }[] = [];
    const { pool } = makePool({ heartbeatIntervalMs: 100 });
    pool.attachRunnerExitTokensSink((exit) => exits.push(exit));
    const pids: number[] = [];
    await pool.runTurn(
      turn({
        sessionId: "spawner",
        script: [
          { kind: "spawn", command: ["sleep", "30"] },
          // Outlives a few heartbeats, so an earlier state naming it is sent before the newest one.
          { kind: "spawn", command: ["sleep", "0.3"] },
          { kind: "wait", ms: 600 },
        ],
      }),
      { onProgress: () => {} },
    );
    const view = await pool.tap("spawner", () => {});
    for (const h of view?.snapshot.history ?? [])
      if (h.role === "tool" && /^\d+$/.test(h.text)) pids.push(Number(h.text));
    await view?.close();
    expect(pids).toHaveLength(2);
    stray.push(...pids);
    // Let heartbeats (every 100 ms) carry the state after the short-lived one exited; generous for a loaded machine.
    await waitFor(() => !alive(pids[1] as number));
    await new Promise((r) => setTimeout(r, 1_500));
    const { killChildRunners } = await import("./support/kill.js");
    expect(await killChildRunners()).toBe(1);
    await waitFor(() => exits.length === 1);
    const [longLived, shortLived] = pids as [number, number];
    expect(exits[0]?.killTokens).toEqual([`pgid:${longLived}`]);
    expect(alive(longLived)).toBe(true);
    expect(killContainedProcesses(exits[0]?.killTokens ?? [])).toBe(1);
    await waitFor(() => !alive(longLived));
    expect(alive(shortLived)).toBe(false);
  });

  it("the host consumes containment frames: no event or health projection carries kill tokens", async () => {
    const { host, events } = await startHost({ heartbeatIntervalMs: 100 });
    hosts.push(host);
    await host.runTurn(turn({ script: [{ kind: "spawn", command: ["sleep", "30"] }] }));
    await waitFor(() => host.containment !== undefined);
    stray.push(...(host.containment?.killTokens ?? []).map((t) => Number(t.slice(5))));
    await waitFor(() => events.filter((e) => e.type === "heartbeat").length >= 2);
    expect(JSON.stringify(events)).not.toMatch(/pgid|killTokens|containment/);
    expect(JSON.stringify(host.stats())).not.toMatch(/pgid/);
    const { pool } = makePool({ heartbeatIntervalMs: 100 });
    // An orderly runner stop (pool close) takes this one with it.
    await pool.runTurn(turn({ script: [{ kind: "spawn", command: ["sleep", "30"] }] }));
    await new Promise((r) => setTimeout(r, 300));
    expect(JSON.stringify(pool.health())).not.toMatch(/pgid|killTokens/);
  });
});
