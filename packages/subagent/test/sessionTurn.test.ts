import { randomUUID } from "node:crypto";
import {
  captureDelegatedExecutionScope,
  createScriptedTurnRunner,
  parseDelegatedExecutionScope,
  type SessionTurnRunner,
  scriptTask,
  type TurnHost,
  type TurnRequest,
  type TurnTool,
} from "@crw/brain";
import type { TranscriptMessage } from "@crw/db";
import { RunnerExitedError, SubagentSessionDispatch } from "@crw/subagent";
import { describe, expect, it } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { waitFor } from "./support/runners.js";

closePoolsAfterEach();

/** A daemon-side TurnHost and host tool that write down every seam call in order. */
function seam(steer: TranscriptMessage[][] = []) {
  const calls: string[] = [];
  const toolPids: number[] = [];
  let toolSignal: AbortSignal | undefined;
  const host: TurnHost = {
    record: async (m) => {
      calls.push(
        m.role === "assistant"
          ? `record assistant ${m.content.map((c) => (c.type === "text" ? c.text : `call ${c.name}`)).join("+")}`
          : `record toolResult ${m.toolName}=${m.content}`,
      );
    },
    beforeToolCall: async (c) => {
      calls.push(`intent ${c.name} ${JSON.stringify(c.arguments)}`);
    },
    drainSteering: async () => {
      calls.push("drain");
      return steer.shift() ?? [];
    },
    progress: () => {},
  };
  const echo = (block?: Promise<void>): TurnTool => ({
    name: "Echo",
    description: "echo its argument",
    parameters: { type: "object", properties: { say: { type: "string" } } },
    execute: async (args, ctx) => {
      calls.push(`execute Echo in ${ctx.toolCallId ? "daemon" : "?"}`);
      toolPids.push(process.pid);
      toolSignal = ctx.signal;
      if (block) await block;
      return { content: `echo:${String(args.say)}` };
    },
  });
  return { calls, host, echo, toolPids, signal: () => toolSignal };
}

function request(task: string, tools: TurnTool[], signal = new AbortController().signal): TurnRequest {
  return {
    sessionId: randomUUID(),
    principalAccountId: "acct-1",
    model: "scripted",
    systemPrompt: "You are a worker.",
    context: [{ role: "user", content: task }],
    tools,
    // A delegated child's turn: it carries its durable scope (root sessions stay in the daemon).
    scope: parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({ accountId: "acct-1", target: { kind: "host", ref: null } }),
    ),
    readOnly: false,
    workDir: null,
    signal,
  };
}

const task = scriptTask({ rounds: [[{ name: "Echo", arguments: { say: "hi" } }]], answer: "finished" });

/** The seam calls of `task`'s turn, in order, wherever its model loop runs. */
const echoTurnCalls = [
  "record assistant call Echo",
  'intent Echo {"say":"hi"}',
  "execute Echo in daemon",
  "record toolResult Echo=echo:hi",
  "drain",
  "record assistant finished",
];

describe("the delegation core's session turn in a runner (brain's seam, unchanged)", () => {
  it("a session turn in a runner makes the same seam calls, in the same order, as in the daemon (S004-151)", async () => {
    const local = seam([[{ role: "custom", customType: "steer", content: "also do X" }]]);
    const inProcess: SessionTurnRunner = createScriptedTurnRunner();
    const localOutcome = await inProcess.runTurn(request(task, [local.echo()]), local.host);

    const { pool, events } = makePool();
    const dispatch = new SubagentSessionDispatch({ pool, inProcess, runnerKind: "scripted" });
    const remote = seam([[{ role: "custom", customType: "steer", content: "also do X" }]]);
    const remoteOutcome = await dispatch.runTurn(request(task, [remote.echo()]), remote.host);

    expect(remoteOutcome).toEqual(localOutcome);
    expect(remote.calls).toEqual(local.calls);
    expect(remote.calls).toEqual(echoTurnCalls);
    // The host tool ran in the daemon; the model loop ran in the runner.
    expect(remote.toolPids).toEqual([process.pid]);
    expect(events.filter((e) => e.type === "turn_dispatched")).toHaveLength(1);
  });

  it("a root session's turn (no durable scope) always runs in the daemon", async () => {
    const { pool, events } = makePool();
    const local = seam();
    const dispatch = new SubagentSessionDispatch({
      pool,
      inProcess: createScriptedTurnRunner(),
      runnerKind: "scripted",
    });
    expect(await dispatch.runTurn({ ...request(task, [local.echo()]), scope: null }, local.host)).toEqual({
      stopReason: "stop",
    });
    expect(events).toEqual([]);
  });

  it("with runners off the same seam runs the turn in the daemon, without a fork (S004-441)", async () => {
    const { pool, events } = makePool();
    const local = seam();
    const dispatch = new SubagentSessionDispatch({
      pool,
      inProcess: createScriptedTurnRunner(),
      runnerEnabled: () => false,
      runnerKind: "scripted",
    });
    expect(await dispatch.runTurn(request(task, [local.echo()]), local.host)).toEqual({ stopReason: "stop" });
    expect(events).toEqual([]);
    // the whole turn ran here: the model loop's records and the tool, on this process
    expect(local.calls).toEqual(echoTurnCalls);
    expect(local.toolPids).toEqual([process.pid]);
  });

  it("the agent loop (pi-agent-core with the scripted provider) runs a turn inside a runner", async () => {
    const { pool } = makePool();
    const remote = seam();
    const dispatch = new SubagentSessionDispatch({ pool, inProcess: createScriptedTurnRunner() });
    const outcome = await dispatch.runTurn(request("summarize the repo", []), remote.host);
    expect(outcome).toEqual({ stopReason: "stop" });
    expect(remote.calls).toEqual(["record assistant Done: summarize the repo"]);
  });

  it("the runner's agent loop gets the daemon's provider options (named scripts, base URLs) at boot", async () => {
    const remote = seam();
    const withOptions = makePool({
      agentOptions: () => ({ scripts: { greet: [{ text: "hello from a named script" }] } }),
    });
    const dispatch = new SubagentSessionDispatch({
      pool: withOptions.pool,
      inProcess: createScriptedTurnRunner(),
    });
    const named = { ...request("say hi", []), model: "scripted:greet" };
    expect(await dispatch.runTurn(named, remote.host)).toEqual({ stopReason: "stop" });
    expect(remote.calls).toEqual(["record assistant hello from a named script"]);
    // Without them the runner cannot resolve the name, and says so in the outcome.
    const bare = new SubagentSessionDispatch({
      pool: makePool().pool,
      inProcess: createScriptedTurnRunner(),
    });
    const outcome = await bare.runTurn({ ...request("say hi", []), model: "scripted:greet" }, seam().host);
    expect(outcome).toMatchObject({
      stopReason: "error",
      errorMessage: expect.stringMatching(/no script named greet/),
    });
  });

  it("a runner killed while a host tool runs fails the turn at once with a typed error and aborts the tool", async () => {
    const { pool, events } = makePool();
    let release: () => void = () => {};
    const blocked = new Promise<void>((r) => {
      release = r;
    });
    const remote = seam();
    const dispatch = new SubagentSessionDispatch({
      pool,
      inProcess: createScriptedTurnRunner(),
      runnerKind: "scripted",
    });
    const running = dispatch
      .runTurn(request(task, [remote.echo(blocked)]), remote.host)
      .catch((e: unknown) => e);
    await waitFor(() => remote.calls.includes("execute Echo in daemon"));
    const ready = events.find((e) => e.type === "runner_ready");
    expect(ready).toBeDefined();
    const { killChildRunners } = await import("./support/kill.js");
    expect(await killChildRunners()).toBe(1);
    expect(await running).toBeInstanceOf(RunnerExitedError);
    expect(remote.signal()?.aborted).toBe(true);
    release();
    // Nothing after the kill was recorded: the turn is not replayed.
    expect(remote.calls.at(-1)).toBe("execute Echo in daemon");
  });

  it("aborting the turn's signal while it is queued removes it before it runs (S004-187)", async () => {
    const { pool, events } = makePool();
    const dispatch = new SubagentSessionDispatch({
      pool,
      inProcess: createScriptedTurnRunner(),
      runnerKind: "scripted",
    });
    const first = seam();
    let release: () => void = () => {};
    const blocked = new Promise<void>((r) => {
      release = r;
    });
    const busy = dispatch.runTurn(request(task, [first.echo(blocked)]), first.host);
    const controller = new AbortController();
    const second = seam();
    const queued = dispatch
      .runTurn(request(task, [second.echo()], controller.signal), second.host)
      .catch((e: unknown) => e);
    await waitFor(() => first.calls.includes("execute Echo in daemon"));
    controller.abort();
    expect(await queued).toMatchObject({ name: "DelegationAbortedError" });
    expect(second.calls).toEqual([]);
    release();
    expect(await busy).toEqual({ stopReason: "stop" });
    // Removed, not just answered: once the runner is free it is never dispatched.
    expect(pool.health()).toMatchObject({ queued: 0, turns: 0 });
    expect(events.filter((e) => e.type === "turn_dispatched")).toHaveLength(1);
    expect(second.calls).toEqual([]);
  });
});
