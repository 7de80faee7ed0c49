import { randomUUID } from "node:crypto";
import {
  captureDelegatedExecutionScope,
  createScriptedTurnRunner,
  parseDelegatedExecutionScope,
  scriptTask,
  type TurnHost,
  type TurnRequest,
  type TurnTool,
} from "@crw/brain";
import type { TranscriptMessage } from "@crw/db";
import { type ProcessChangedSink, SubagentSessionDispatch } from "@crw/subagent";
import { describe, expect, it } from "vitest";
import { killChildRunners } from "./support/kill.js";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { turn, waitFor } from "./support/runners.js";

closePoolsAfterEach();

function request(task: string, tools: TurnTool[]): TurnRequest {
  return {
    sessionId: randomUUID(),
    principalAccountId: "acct-1",
    model: "scripted",
    systemPrompt: "You are a worker.",
    context: [{ role: "user", content: task }],
    tools,
    scope: parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({ accountId: "acct-1", target: { kind: "host", ref: null } }),
    ),
    readOnly: false,
    workDir: null,
    signal: new AbortController().signal,
  };
}

function host(steer: TranscriptMessage[][]): TurnHost {
  return {
    record: async () => {},
    beforeToolCall: async () => {},
    drainSteering: async () => steer.shift() ?? [],
    progress: () => {},
  };
}

const echo: TurnTool = {
  name: "Echo",
  description: "echo",
  parameters: { type: "object", properties: { say: { type: "string" } } },
  execute: async (args) => ({ content: `echo:${String(args.say)}` }),
};

describe("daemon sinks the pool feeds (the pool owns its hosts' callbacks)", () => {
  it("attachSteerSettledSink: steering a runner turn consumed reaches the sink, once per non-empty drain", async () => {
    const { pool, events } = makePool();
    const settled: { runnerId: string; sessionId: string; count: number }[] = [];
    pool.attachSteerSettledSink((s) => settled.push(s));
    const dispatch = new SubagentSessionDispatch({
      pool,
      inProcess: createScriptedTurnRunner(),
      runnerKind: "scripted",
    });
    const task = scriptTask({ rounds: [[{ name: "Echo", arguments: { say: "hi" } }]], answer: "done" });
    const req = request(task, [echo]);
    const steer: TranscriptMessage[][] = [
      [
        { role: "custom", customType: "steer", content: "also X" },
        { role: "custom", customType: "steer", content: "and Y" },
      ],
    ];
    expect(await dispatch.runTurn(req, host(steer))).toEqual({ stopReason: "stop" });
    expect(settled).toEqual([{ runnerId: expect.any(String), sessionId: req.sessionId, count: 2 }]);
    expect(settled[0]?.runnerId).toBe(pool.routeOf(req.sessionId));
    // A turn whose drains come back empty settles nothing.
    expect(await dispatch.runTurn(request(task, [echo]), host([]))).toEqual({ stopReason: "stop" });
    expect(settled).toHaveLength(1);
    // A sink that throws is reported by name; the turn is not failed by it.
    pool.attachSteerSettledSink(() => {
      throw new Error("steer table unavailable");
    });
    const steerAgain: TranscriptMessage[][] = [
      [{ role: "custom", customType: "steer", content: "once more" }],
    ];
    expect(await dispatch.runTurn(request(task, [echo]), host(steerAgain))).toEqual({ stopReason: "stop" });
    expect(events.filter((e) => e.type === "sink_failed")).toEqual([
      { type: "sink_failed", sink: "steerSettled", error: "steer table unavailable" },
    ]);
  });

  it("attachProcessChangedSink: a runner's start and exit reach the sink as typed facts (no pid)", async () => {
    const { pool } = makePool();
    const changes: Parameters<ProcessChangedSink>[0][] = [];
    pool.attachProcessChangedSink((c) => changes.push(c));
    expect((await pool.runTurn(turn())).stopReason).toBe("end");
    expect(changes).toEqual([{ runnerId: "runner-1", state: "started" }]);
    // Kill the runner from outside (SIGKILL): the exit is a process change; new work starts another runner.
    expect(await killChildRunners()).toBe(1);
    await waitFor(() => changes.length >= 2);
    expect(changes[1]).toEqual({ runnerId: "runner-1", state: "exited", code: null, signal: "SIGKILL" });
    expect((await pool.runTurn(turn())).stopReason).toBe("end");
    await waitFor(() => changes.length >= 3);
    expect(changes[2]).toEqual({ runnerId: "runner-2", state: "started" });
  });

  it("the pool's execution projection of a session: its runner and placement state", async () => {
    const { pool } = makePool();
    expect(pool.executionOf("child-e")).toBeUndefined();
    const running = pool.runTurn(turn({ sessionId: "child-e", script: [{ kind: "wait", ms: 60_000 }] }));
    await waitFor(() => pool.sessionState("child-e") === "running");
    expect(pool.executionOf("child-e")).toEqual({ runnerId: "runner-1", state: "running" });
    expect(pool.executions()).toEqual([{ sessionId: "child-e", runnerId: "runner-1", state: "running" }]);
    pool.abortChannel(turn().channelId);
    await running.catch(() => {});
    // The route stays until the session is released: routed and idle.
    expect(pool.executionOf("child-e")).toEqual({ runnerId: "runner-1", state: "idle" });
    expect(await pool.release("child-e")).toBe("released");
    expect(pool.executionOf("child-e")).toBeUndefined();
  });
});
