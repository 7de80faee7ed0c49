import {
  HOST_RPC_CLOSED_TEXT,
  type InputFrame,
  type OutputFrame,
  RunnerCore,
  type RunnerPort,
  ScriptedTurnExecutor,
  type SessionBackendLoader,
} from "@crw/subagent";
import { describe, expect, it } from "vitest";
import { waitFor } from "./support/runners.js";

/** The runner's side of a channel, in memory: what the daemon would send and what the runner posts. */
function channel() {
  const out: OutputFrame[] = [];
  const logs: string[] = [];
  let onMessage: (raw: unknown) => void = () => {};
  let onDisconnect: () => void = () => {};
  const exits: number[] = [];
  const port: RunnerPort = {
    send: (f) => {
      out.push(f);
      return true;
    },
    onMessage: (l) => {
      onMessage = l;
    },
    onDisconnect: (l) => {
      onDisconnect = l;
    },
    exit: (code) => exits.push(code),
    log: (_level, msg) => logs.push(msg),
  };
  return {
    port,
    out,
    logs,
    exits,
    deliver: (f: InputFrame | unknown) => onMessage(f),
    disconnect: () => onDisconnect(),
  };
}

const boot = (buildId = "build-1"): InputFrame => ({
  type: "boot",
  requestId: "boot-1",
  runnerId: "r",
  buildId,
  retryPolicy: { revision: 2, maxRetries: 1, initialDelayMs: 10, multiplier: 2 },
  catalog: { revision: 1, public: [], accounts: {} },
  heartbeatIntervalMs: 60_000,
});

describe("RunnerCore", () => {
  it("a runner serves nothing before the daemon's boot frame carries its policy", async () => {
    const c = channel();
    new RunnerCore(c.port, new ScriptedTurnExecutor(), "build-1", undefined).start();
    expect(c.out[0]).toMatchObject({ type: "hello", buildId: "build-1" });
    c.deliver({
      type: "turn",
      requestId: "t0",
      turn: { turnId: "t", channelId: "c", sessionId: "s", prompt: "p" },
    });
    // The turn waits for the request handling to load; the boot frame behind it waits its turn.
    c.deliver(boot());
    await waitFor(() => c.out.length === 3);
    expect(c.out[1]).toMatchObject({
      type: "turnReply",
      requestId: "t0",
      result: { error: { code: "not_booted" } },
    });
    expect(c.out[2]).toMatchObject({ type: "bootReply", result: { ok: { policyRevision: 2 } } });
  });

  it("a boot frame with nothing ahead of it is answered at once, before the request handling loads", () => {
    const c = channel();
    new RunnerCore(c.port, new ScriptedTurnExecutor(), "build-1", undefined).start();
    c.deliver(boot());
    expect(c.out[1]).toMatchObject({ type: "bootReply", result: { ok: { policyRevision: 2 } } });
  });

  it("frames keep their order while the request handling loads: a first turn waits for it, never races it", async () => {
    const c = channel();
    new RunnerCore(c.port, new ScriptedTurnExecutor(), "build-1", undefined).start();
    c.deliver(boot());
    c.deliver({ type: "release", requestId: "r1", sessionId: "s" });
    c.deliver({
      type: "turn",
      requestId: "t1",
      turn: { turnId: "a", channelId: "c", sessionId: "s", prompt: "first" },
    });
    await waitFor(() => c.out.some((f) => f.type === "turnReply"));
    const replies = c.out.filter(
      (f) => f.type !== "hello" && f.type !== "progress" && f.type !== "heartbeat",
    );
    expect(replies.map((f) => f.requestId)).toEqual(["boot-1", "r1", "t1"]);
    expect(replies[2]).toMatchObject({ type: "turnReply", result: { ok: { text: "done: first" } } });
  });

  it("a booted runner loads its session backend before any session turn asks for it, never before boot", async () => {
    const c = channel();
    const loads: unknown[] = [];
    // A backend that never finishes loading: the warm-up must not wait for it or fail on it.
    const loader: SessionBackendLoader = (options) => {
      loads.push(options);
      return new Promise(() => {});
    };
    new RunnerCore(c.port, new ScriptedTurnExecutor(), "build-1", undefined, loader).start();
    // A frame ahead of boot loads the request handling; the backend still waits for the boot's options.
    c.deliver({ type: "release", requestId: "r0", sessionId: "s" });
    await waitFor(() => c.out.some((f) => f.requestId === "r0"));
    await new Promise((r) => setImmediate(r));
    expect(loads).toEqual([]);
    c.deliver({ ...boot(), agent: { scripts: { x: [{ text: "y" }] } } });
    await waitFor(() => loads.length === 1);
    expect(loads[0]).toEqual({ scripts: { x: [{ text: "y" }] } });
    // Warmed from both places (after boot, after the request handling), it is one load.
    await new Promise((r) => setTimeout(r, 20));
    expect(loads).toHaveLength(1);
  });

  it("a runner that boots with nothing ahead warms its session backend right after its request handling", async () => {
    const c = channel();
    let loads = 0;
    const loader: SessionBackendLoader = () => {
      loads += 1;
      return Promise.reject(new Error("agent loop unavailable"));
    };
    new RunnerCore(c.port, new ScriptedTurnExecutor(), "build-1", undefined, loader).start();
    c.deliver(boot());
    await waitFor(() => loads === 1);
    // A failed warm-up is no crash of the runner: it goes on serving.
    c.deliver({ type: "release", requestId: "r1", sessionId: "s" });
    await waitFor(() => c.out.some((f) => f.requestId === "r1"));
    expect(c.exits).toEqual([]);
  });

  it("an imported executor comes with the request handling: a turn and its abort queued behind boot run in order", async () => {
    const c = channel();
    new RunnerCore(c.port, async () => new ScriptedTurnExecutor(), "build-1", undefined).start();
    c.deliver(boot());
    c.deliver({
      type: "turn",
      requestId: "t1",
      turn: {
        turnId: "a",
        channelId: "c",
        sessionId: "s",
        prompt: "p",
        script: [
          { kind: "text", text: "started" },
          { kind: "wait", ms: 60_000 },
        ],
      },
    });
    c.deliver({ type: "abort", requestId: "x1", turnId: "a", interruption: { origin: "stop" } });
    await waitFor(() => c.out.some((f) => f.type === "turnReply"));
    // The turn had begun when its abort was handled: it stops with what it said, not before its first step.
    expect(c.out.find((f) => f.type === "turnReply")).toMatchObject({
      result: { ok: { stopReason: "aborted", text: "started" } },
    });
  });

  it("a runner whose turn-time code cannot be imported exits after its boot reply instead of serving", async () => {
    const c = channel();
    new RunnerCore(c.port, () => Promise.reject(new Error("gone")), "build-1", undefined).start();
    c.deliver(boot());
    expect(c.out[1]).toMatchObject({ type: "bootReply", result: { ok: {} } });
    c.deliver({ type: "release", requestId: "r1", sessionId: "s" });
    await waitFor(() => c.exits.length === 1);
    expect(c.exits).toEqual([1]);
    expect(c.logs).toContain("runner could not load its request handling");
    // The waiting request is never answered here: the daemon fails it as a runner exit.
    expect(c.out.map((f) => f.type)).toEqual(["hello", "bootReply"]);
  });

  it("the runner refuses a boot frame from a different build and exits (S004-458)", async () => {
    const c = channel();
    new RunnerCore(c.port, new ScriptedTurnExecutor(), "build-1", undefined).start();
    c.deliver(boot("build-2"));
    expect(c.out[1]).toMatchObject({ type: "bootReply", result: { error: { code: "build_mismatch" } } });
    await waitFor(() => c.exits.length === 1);
    expect(c.exits).toEqual([1]);
  });

  it("on daemon disconnect the runner closes its host RPC client: a pending call fails with the fixed text", async () => {
    const c = channel();
    new RunnerCore(c.port, new ScriptedTurnExecutor(), "build-1", undefined).start();
    c.deliver(boot());
    c.deliver({
      type: "turn",
      requestId: "t1",
      turn: {
        turnId: "turn-1",
        channelId: "c",
        sessionId: "s",
        prompt: "p",
        script: [{ kind: "hostRpc", method: "crw.api", params: { method: "GET", path: "/x" } }],
      },
    });
    await waitFor(() => c.out.some((f) => f.type === "hostRpc"));
    c.disconnect();
    await waitFor(() => c.out.some((f) => f.type === "turnReply"));
    const reply = c.out.find((f) => f.type === "turnReply");
    expect(reply).toMatchObject({
      result: { error: { name: "HostRpcClosedError", message: HOST_RPC_CLOSED_TEXT } },
    });
    await waitFor(() => c.exits.length === 1);
  });

  it("invalid frames are logged and never acted on (S004-151)", async () => {
    const c = channel();
    new RunnerCore(c.port, new ScriptedTurnExecutor(), "build-1", undefined).start();
    c.deliver({ type: "boot", requestId: "b", buildId: "build-1" });
    c.deliver({ type: "shutdown" });
    c.deliver("shutdown");
    c.deliver(null);
    await waitFor(() => c.logs.filter((l) => l === "refused invalid frame").length === 4);
    expect(c.out).toHaveLength(1);
    expect(c.exits).toEqual([]);
  });

  it("full events cross IPC only while a view is subscribed; progress stays the narrow stream (S004-487)", async () => {
    const c = channel();
    new RunnerCore(c.port, new ScriptedTurnExecutor(), "build-1", undefined).start();
    c.deliver(boot());
    const script = [
      { kind: "reasoning", text: "thinking" },
      { kind: "tool", name: "Read", result: "contents" },
      { kind: "text", text: "answer" },
    ];
    c.deliver({
      type: "turn",
      requestId: "t1",
      turn: { turnId: "a", channelId: "c", sessionId: "s", prompt: "p", script },
    });
    await waitFor(() => c.out.some((f) => f.type === "turnReply"));
    expect(c.out.filter((f) => f.type === "tapEvent")).toEqual([]);
    expect(c.out.filter((f) => f.type === "progress").map((f) => f.type === "progress" && f.text)).toEqual([
      "answer",
    ]);
    c.deliver({ type: "tap", requestId: "v1", tapId: "view", sessionId: "s", history: { limit: 10 } });
    c.deliver({
      type: "turn",
      requestId: "t2",
      turn: { turnId: "b", channelId: "c", sessionId: "s", prompt: "p", script },
    });
    await waitFor(() => c.out.filter((f) => f.type === "turnReply").length === 2);
    expect(c.out.filter((f) => f.type === "tapEvent")).toHaveLength(4);
    c.deliver({ type: "untap", requestId: "v2", tapId: "view" });
    c.deliver({
      type: "turn",
      requestId: "t3",
      turn: { turnId: "c", channelId: "c", sessionId: "s", prompt: "p", script },
    });
    await waitFor(() => c.out.filter((f) => f.type === "turnReply").length === 3);
    expect(c.out.filter((f) => f.type === "tapEvent")).toHaveLength(4);
  });
});
