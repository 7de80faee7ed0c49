import { getEventListeners } from "node:events";
import {
  currentDispatchedTurn,
  DESKTOP_UNKNOWN_OUTCOME_SUFFIX,
  HOST_RPC_CLOSED_TEXT,
  HostRpcClient,
  HostRpcClosedError,
  HostRpcRefusedError,
  HostRpcTimeoutError,
  type HostRpcTransport,
  outsideDispatchedTurn,
  RemoteTurnError,
  runInDispatchedTurn,
  SubagentRunnerPool,
} from "@crw/subagent";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { standInRunner, startHost, turn, waitFor } from "./support/runners.js";

closePoolsAfterEach();

function transport() {
  const sent: { type: string; requestId: string; rpcId?: string; method?: string; turnId?: string }[] = [];
  const t: HostRpcTransport = {
    send: (f) => {
      sent.push(f);
      return true;
    },
    cancel: (f) => {
      sent.push(f);
      return true;
    },
  };
  return { t, sent };
}

const inTurn = <T>(signal: AbortSignal, work: () => T) =>
  runInDispatchedTurn({ turnId: "turn-1", sessionId: "s-1", signal }, work);
const apiParams = { method: "GET" as const, path: "/sessions" };

/** A script step that reports result r of call c delivered to `parentSessionId`. */
const resultDelivered = (parentSessionId: string) => ({
  kind: "hostRpc" as const,
  method: "delegation.resultDelivered" as const,
  params: { parentSessionId, results: [{ resultId: "r", toolCallId: "c", kind: "result" }] },
});

/** A turn of session "intruder" that reports a delivery to `parentSessionId`: the error it ends with. */
const intrudeOn = (pool: ReturnType<typeof makePool>["pool"], parentSessionId: string) =>
  pool
    .runTurn(turn({ sessionId: "intruder", channelId: "ch-x", script: [resultDelivered(parentSessionId)] }))
    .catch((x: unknown) => x);

describe("HostRpcClient (runner side)", () => {
  it("the dispatched-call context (rpcTurn) names the turn a host call belongs to, and nothing outside it", async () => {
    const { t, sent } = transport();
    const client = new HostRpcClient(t);
    const signal = new AbortController().signal;
    expect(currentDispatchedTurn()).toBeUndefined();
    const pending = runInDispatchedTurn({ turnId: "turn-9", sessionId: "s-9", signal }, async () => {
      await Promise.resolve();
      expect(currentDispatchedTurn()?.turnId).toBe("turn-9");
      // A read-only view started from inside a turn gets no turn authority.
      expect(outsideDispatchedTurn(() => currentDispatchedTurn())).toBeUndefined();
      return client.call("crw.api", apiParams);
    });
    await waitFor(() => sent.length === 1);
    expect(sent[0]).toMatchObject({ type: "hostRpc", turnId: "turn-9", method: "crw.api" });
    client.settle(sent[0]?.requestId ?? "", { ok: { fine: true } });
    expect(await pending).toEqual({ fine: true });
  });

  it("a host call outside a dispatched turn is refused with an error, not dropped", async () => {
    const { t, sent } = transport();
    const client = new HostRpcClient(t);
    const error = await client
      .call("plugin.applyChange", { pluginId: "skills", change: { kind: "skill", name: "x", body: "y" } })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(HostRpcRefusedError);
    expect((error as HostRpcRefusedError).reason).toBe("outside_turn");
    expect(sent).toEqual([]);
  });

  it("close() rejects pending calls with the fixed text and removes timers and abort listeners", async () => {
    // Fake timers only count the calls' deadline timers; nothing here waits on time.
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    onTestFinished(() => {
      vi.useRealTimers();
    });
    const { t, sent } = transport();
    const client = new HostRpcClient(t);
    const controller = new AbortController();
    const pending = inTurn(controller.signal, () => [
      client.call("crw.api", apiParams),
      client.call("crw.api", apiParams),
    ]);
    expect(sent.filter((f) => f.type === "hostRpc")).toHaveLength(2);
    expect(getEventListeners(controller.signal, "abort")).toHaveLength(2);
    expect(vi.getTimerCount()).toBe(2);
    client.close();
    expect(vi.getTimerCount()).toBe(0);
    for (const p of pending) {
      const e = await p.catch((x: unknown) => x);
      expect(e).toBeInstanceOf(HostRpcClosedError);
      expect((e as Error).message).toBe(HOST_RPC_CLOSED_TEXT);
    }
    expect(client.pendingCount).toBe(0);
    expect(getEventListeners(controller.signal, "abort")).toHaveLength(0);
    // A late answer for a closed call is ignored.
    expect(client.settle(sent[0]?.requestId ?? "", { ok: 1 })).toBe(false);
  });

  it("rejected desktop calls keep the unknown-outcome, do-not-replay suffix", async () => {
    const { t } = transport();
    const client = new HostRpcClient(t);
    const pending = inTurn(new AbortController().signal, () =>
      client.call("desktop.command", { command: "open", args: ["/tmp/x"] }),
    );
    client.close();
    const e = (await pending.catch((x: unknown) => x)) as Error;
    expect(e.message).toBe(HOST_RPC_CLOSED_TEXT + DESKTOP_UNKNOWN_OUTCOME_SUFFIX);
    expect(e.message).toMatch(/unknown, do not replay/);
    // A desktop call made after close, and one whose channel is already gone when it is sent, say the same.
    const late = await inTurn(new AbortController().signal, () =>
      client.call("desktop.command", { command: "open", args: [] }),
    ).catch((x: unknown) => x);
    expect((late as Error).message).toBe(HOST_RPC_CLOSED_TEXT + DESKTOP_UNKNOWN_OUTCOME_SUFFIX);
    const gone = new HostRpcClient({ send: () => false, cancel: () => false });
    const unsent = await inTurn(new AbortController().signal, () =>
      gone.call("desktop.command", { command: "open", args: [] }),
    ).catch((x: unknown) => x);
    expect((unsent as Error).message).toBe(HOST_RPC_CLOSED_TEXT + DESKTOP_UNKNOWN_OUTCOME_SUFFIX);
    // Other methods carry the plain text.
    const api = await inTurn(new AbortController().signal, () => gone.call("crw.api", apiParams)).catch(
      (x: unknown) => x,
    );
    expect((api as Error).message).toBe(HOST_RPC_CLOSED_TEXT);
  });

  it("close() with no pending calls does nothing", () => {
    const { t, sent } = transport();
    const client = new HostRpcClient(t);
    expect(() => client.close()).not.toThrow();
    expect(sent).toEqual([]);
    expect(client.pendingCount).toBe(0);
  });

  it("calls are bounded: a timeout rejects and cancels; an abort cancels with the original call id", async () => {
    const { t, sent } = transport();
    const client = new HostRpcClient(t, 50);
    const controller = new AbortController();
    const timedOut = inTurn(controller.signal, () => client.call("crw.api", apiParams));
    await expect(timedOut).rejects.toBeInstanceOf(HostRpcTimeoutError);
    const cancelled = inTurn(controller.signal, () =>
      client.call("crw.api", apiParams, { timeoutMs: 10_000 }),
    );
    controller.abort();
    await expect(cancelled).rejects.toMatchObject({ name: "AbortError" });
    const calls = sent.filter((f) => f.type === "hostRpc").map((f) => f.requestId);
    const cancels = sent.filter((f) => f.type === "hostRpcCancel").map((f) => f.rpcId);
    expect(cancels).toEqual(calls);
    expect(client.pendingCount).toBe(0);
  });

  it("delegation.resultDelivered has no idle deadline; channel loss rejects it, with no retry", async () => {
    const { t, sent } = transport();
    const client = new HostRpcClient(t, 20);
    const signal = new AbortController().signal;
    const delivered = inTurn(signal, () =>
      client.call("delegation.resultDelivered", {
        parentSessionId: "p",
        results: [{ resultId: "r", toolCallId: "c", kind: "result" }],
      }),
    );
    const api = inTurn(signal, () => client.call("crw.api", apiParams));
    await expect(api).rejects.toBeInstanceOf(HostRpcTimeoutError);
    await new Promise((r) => setTimeout(r, 100));
    expect(client.pendingCount).toBe(1);
    client.close();
    await expect(delivered).rejects.toMatchObject({ message: HOST_RPC_CLOSED_TEXT });
    expect(
      sent.filter((f) => f.type === "hostRpc" && f.method === "delegation.resultDelivered"),
    ).toHaveLength(1);
  });

  it("params are validated against the method's schema before anything is sent", async () => {
    const { t, sent } = transport();
    const client = new HostRpcClient(t);
    const e = await inTurn(new AbortController().signal, () =>
      client.call("plugin.applyChange", {
        pluginId: "p",
        change: { kind: "shell", cmd: "rm -rf /" },
      } as never),
    ).catch((x: unknown) => x);
    expect(e).toMatchObject({ reason: "invalid_params" });
    expect(sent).toEqual([]);
  });
});

describe("the daemon's side of a reverse host call", () => {
  it("the daemon checks plugin.applyChange params against the plugin-boundary schema before its handler, and answers only once the handler has", async () => {
    const handled: unknown[] = [];
    const order: string[] = [];
    // A stand-in runner puts the calls on the channel as given: no runner-side check filters them first.
    const { host } = await startHost({
      ...standInRunner,
      hostRpc: async (_method, params) => {
        await new Promise((r) => setTimeout(r, 100));
        handled.push(params);
        order.push("handler answered");
        return { applied: true };
      },
    });
    onTestFinished(() => host.shutdown(1_000));
    const valid = { pluginId: "skills", change: { kind: "skill", name: "tidy", body: "# tidy" } };
    const result = await host.runTurn(
      turn({
        script: [
          {
            kind: "hostRpc",
            method: "plugin.applyChange",
            params: { pluginId: "p", change: { kind: "shell" } },
          },
          { kind: "hostRpc", method: "plugin.applyChange", params: valid },
        ],
      }),
      { onProgress: () => {} },
    );
    order.push("turn settled");
    expect(JSON.parse(result.text)).toEqual([
      { error: expect.objectContaining({ name: "HostRpcRefusedError", code: "invalid_params" }) },
      { ok: { applied: true } },
    ]);
    expect(handled).toEqual([valid]);
    expect(order).toEqual(["handler answered", "turn settled"]);
  });
});

describe("cancelling a reverse host call across the process boundary", () => {
  it("a runner's hostRpcCancel aborts the daemon's handler for that call while the turn goes on", async () => {
    const seen: string[] = [];
    const { host } = await startHost({
      ...standInRunner,
      env: { ...standInRunner.env, CRW_STANDIN_CANCEL_MS: "50" },
      hostRpc: (_method, _params, ctx) =>
        new Promise((resolve, reject) => {
          const timer = setTimeout(() => {
            seen.push("not cancelled");
            resolve(null);
          }, 5_000);
          ctx.signal.addEventListener("abort", () => {
            clearTimeout(timer);
            seen.push(`aborted while ${host.activeTurns} turn runs`);
            reject(new Error("cancelled by the runner"));
          });
        }),
    });
    onTestFinished(() => host.shutdown(1_000));
    const result = await host.runTurn(
      turn({ script: [{ kind: "hostRpc", method: "crw.api", params: apiParams }] }),
    );
    expect(seen).toEqual(["aborted while 1 turn runs"]);
    expect(JSON.parse(result.text)).toEqual([
      { error: expect.objectContaining({ message: "cancelled by the runner" }) },
    ]);
  });
});

describe("reverse host calls from a real runner", () => {
  it("a runner's plugin.applyChange host call goes under its dispatched turn and settles on the daemon's answer", async () => {
    const calls: { method: string; params: unknown; turnId: string }[] = [];
    const order: string[] = [];
    const { pool } = makePool({
      hostRpc: async (method, params, ctx) => {
        calls.push({ method, params, turnId: ctx.turnId });
        await new Promise((r) => setTimeout(r, 200));
        order.push("daemon answered");
        return { applied: true, revision: 7 };
      },
    });
    const seen: string[] = [];
    const request = turn({
      sessionId: "plug",
      script: [
        {
          kind: "hostRpc",
          method: "plugin.applyChange",
          params: { pluginId: "skills", change: { kind: "skill", name: "tidy", body: "# tidy" } },
        },
        { kind: "text", text: "saved" },
      ],
    });
    const running = pool.runTurn(request).then((r) => {
      order.push("turn settled");
      return r;
    });
    await waitFor(() => pool.sessionState("plug") === "running");
    const view = await pool.tap("plug", (e) =>
      seen.push(e.kind === "tool" ? `${e.phase}:${e.result ?? ""}` : e.kind),
    );
    expect((await running).text).toBe("saved");
    expect(calls).toEqual([
      {
        method: "plugin.applyChange",
        params: { pluginId: "skills", change: { kind: "skill", name: "tidy", body: "# tidy" } },
        turnId: request.turnId,
      },
    ]);
    expect(order).toEqual(["daemon answered", "turn settled"]);
    expect(seen).toContain('end:{"applied":true,"revision":7}');
    await view?.close();
  });

  it("the reverse methods are workflow.addNodes, crw.api, desktop.command, plugin.applyChange, delegation.resultDelivered", async () => {
    const methods: string[] = [];
    const { pool } = makePool({
      hostRpc: async (method) => {
        methods.push(method);
        return null;
      },
    });
    pool.attachResultDeliveredSink(async () => {});
    await pool.runTurn(
      turn({
        sessionId: "all",
        script: [
          {
            kind: "hostRpc",
            method: "workflow.addNodes",
            params: { workflowId: "w", nodes: [{ id: "n", prompt: "p" }] },
          },
          { kind: "hostRpc", method: "crw.api", params: { method: "GET", path: "/x" } },
          { kind: "hostRpc", method: "desktop.command", params: { command: "notify", args: [] } },
          {
            kind: "hostRpc",
            method: "plugin.applyChange",
            params: { pluginId: "mcp", change: { kind: "mcpServer", name: "fs", command: ["mcp-fs"] } },
          },
          resultDelivered("all"),
        ],
      }),
    );
    expect(methods).toEqual(["workflow.addNodes", "crw.api", "desktop.command", "plugin.applyChange"]);
  });

  it("supportsHostRpc reports whether the shared handler exists, with no method argument", () => {
    expect(makePool().pool.supportsHostRpc()).toBe(false);
    expect(makePool({ hostRpc: async () => null }).pool.supportsHostRpc()).toBe(true);
    expect(SubagentRunnerPool.prototype.supportsHostRpc.length).toBe(0);
  });

  it("without the capability a runner's host call is refused through the typed request (S004-501)", async () => {
    const { pool } = makePool();
    const e = await pool
      .runTurn(
        turn({
          script: [
            {
              kind: "hostRpc",
              method: "workflow.addNodes",
              params: { workflowId: "w", nodes: [{ id: "n", prompt: "p" }] },
            },
          ],
        }),
      )
      .catch((x: unknown) => x);
    expect(e).toBeInstanceOf(RemoteTurnError);
    expect((e as RemoteTurnError).remote).toMatchObject({
      name: "HostRpcRefusedError",
      code: "host_rpc_refused",
      message: expect.stringContaining("no daemon handler for workflow.addNodes"),
    });
  });
});

describe("delegation.resultDelivered", () => {
  it("carries {resultId, toolCallId, kind} unchanged, answers after publication, and the turn goes on", async () => {
    const published: unknown[] = [];
    const order: string[] = [];
    const { pool } = makePool();
    pool.attachResultDeliveredSink(async (delivery) => {
      await new Promise((r) => setTimeout(r, 150));
      published.push(delivery);
      order.push("published");
    });
    const results = [
      { resultId: "res-1", toolCallId: "call-1", kind: "result" as const },
      { resultId: "res-2", toolCallId: "call-2", kind: "workflow" as const },
    ];
    const view: string[] = [];
    const answers: string[] = [];
    const running = pool.runTurn(
      turn({
        sessionId: "parent-a",
        script: [
          { kind: "wait", ms: 100 },
          {
            kind: "hostRpc",
            method: "delegation.resultDelivered",
            params: { parentSessionId: "parent-a", results },
          },
          { kind: "text", text: "next provider request" },
        ],
      }),
    );
    await waitFor(() => pool.sessionState("parent-a") === "running");
    const tap = await pool.tap("parent-a", (e) => {
      if (e.kind === "tool" && e.phase === "end") {
        order.push("rpc answered");
        answers.push(e.result ?? "");
      }
      if (e.kind === "text") view.push(e.text);
    });
    expect((await running).text).toBe("next provider request");
    expect(published).toEqual([{ parentSessionId: "parent-a", results }]);
    expect(order).toEqual(["published", "rpc answered"]);
    expect(answers).toEqual(['{"published":true}']);
    await tap?.close();
  });

  it("the pool accepts delivery only from the parent session's routed runner", async () => {
    const published: unknown[] = [];
    const { pool } = makePool({ size: { maxRunners: 2, turnsPerRunner: 1 } });
    pool.attachResultDeliveredSink(async (d) => {
      published.push(d);
    });
    // The parent's turn holds runner 1 until the test aborts it, so the intruder must land on runner 2.
    const parent = pool.runTurn(
      turn({ sessionId: "parent-b", channelId: "ch-b", script: [{ kind: "wait", ms: 60_000 }] }),
    );
    await waitFor(() => pool.sessionState("parent-b") === "running");
    const other = await intrudeOn(pool, "parent-b");
    expect(pool.routeOf("intruder")).not.toBe(pool.routeOf("parent-b"));
    expect(other).toBeInstanceOf(RemoteTurnError);
    expect((other as RemoteTurnError).message).toMatch(/not routed to this runner/);
    expect(published).toEqual([]);
    pool.abortChannel("ch-b");
    expect((await parent).stopReason).toBe("aborted");
  });

  it("without a sink nothing is forwarded, while the runner's lifecycle and the routing check stay active (S004-515)", async () => {
    const { pool } = makePool({ size: { maxRunners: 2, turnsPerRunner: 1 } });
    const seen: string[] = [];
    const running = pool.runTurn(
      turn({
        sessionId: "nosink",
        channelId: "ch-n",
        script: [
          { kind: "wait", ms: 100 },
          resultDelivered("nosink"),
          // holds its runner, so the intruder below lands on the other one
          { kind: "wait", ms: 60_000 },
        ],
      }),
    );
    await waitFor(() => pool.sessionState("nosink") === "running");
    const tap = await pool.tap("nosink", (e) => {
      if (e.kind === "tool" && e.phase === "end") seen.push(e.result ?? "");
    });
    // a runner the parent is not routed to is still refused, sink or none
    const intruder = await intrudeOn(pool, "nosink");
    expect(pool.routeOf("intruder")).not.toBe(pool.routeOf("nosink"));
    expect(intruder).toBeInstanceOf(RemoteTurnError);
    expect((intruder as RemoteTurnError).message).toMatch(/not routed to this runner/);
    expect(seen).toEqual(['{"published":false}']);
    pool.abortChannel("ch-n");
    expect((await running).stopReason).toBe("aborted");
    expect((await pool.runTurn(turn())).stopReason).toBe("end");
    await tap?.close();
  });
});
