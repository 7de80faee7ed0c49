import { getEventListeners } from "node:events";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { MCP_TOOLS_SERVER } from "@crw/tools/mcp";
import { afterEach, describe, expect, it } from "vitest";
import { bridgedToolName, McpBridge, type McpBridgeEvent, McpError } from "./index.js";

const server = MCP_TOOLS_SERVER;
const ctx = {
  sessionId: "s",
  principalAccountId: "a",
  toolCallId: "c",
  readOnly: false,
  workDir: null,
  signal: new AbortController().signal,
  progress: () => {},
};
const open: McpBridge[] = [];
/** Scratch directories of the servers: removed once the bridges (and the servers they started) are closed. */
const dirs: string[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((b) => b.close()));
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});
const scratch = () => {
  const dir = mkdtempSync(join(tmpdir(), "crw-mcp-"));
  dirs.push(dir);
  return dir;
};

describe("MCP servers bridged into the tool catalog", () => {
  it("starts a real stdio server, lists its tools under mcp__<server>__<tool>, and calls them", async () => {
    const bridge = await McpBridge.start({
      servers: { calc: { command: process.execPath, args: [server, "2"] } },
    });
    open.push(bridge);
    const tools = bridge.tools();
    expect(tools.map((t) => t.name)).toEqual(["mcp__calc__add", "mcp__calc__echo"]);
    expect(tools[0]).toMatchObject({ description: "Add two integers (MCP server calc)", mutates: true });
    expect(tools[1]).toMatchObject({ mutates: false }); // readOnlyHint
    expect(tools[0]?.parameters).toMatchObject({ type: "object", required: ["a", "b"] });
    const out = await tools[0]?.execute({ a: 2, b: 3 }, ctx);
    expect(out?.content).toMatch(/^5 \(pid \d+\)$/);
    const bad = await tools[0]?.execute({ a: "x", b: 3 }, ctx);
    expect(bad).toEqual({ content: "a and b must be integers", isError: true });
    expect(bridge.servers()).toMatchObject([
      { name: "calc", tools: ["mcp__calc__add", "mcp__calc__echo"], running: true, state: "running" },
    ]);
  });

  it("twelve tools from two servers keep a stable order (servers by name, then the server's own order)", async () => {
    const bridge = await McpBridge.start({
      servers: {
        zeta: { command: process.execPath, args: [server, "2"] },
        alpha: { command: process.execPath, args: [server, "10"] },
      },
    });
    open.push(bridge);
    const names = bridge.tools().map((t) => t.name);
    expect(names).toHaveLength(12);
    expect(names.slice(0, 3)).toEqual(["mcp__alpha__add", "mcp__alpha__echo", "mcp__alpha__probe_03"]);
    expect(names.slice(-2)).toEqual(["mcp__zeta__add", "mcp__zeta__echo"]);
  });

  it("a server that cannot start is a typed start_failed error naming it (with its stderr); nothing is left running", async () => {
    const err = await McpBridge.start({
      servers: {
        good: { command: process.execPath, args: [server, "2"] },
        sick: {
          command: process.execPath,
          args: [server, "2"],
          env: { CRW_MCP_FAIL: "start" },
          timeoutMs: 5000,
        },
      },
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(McpError);
    expect(err).toMatchObject({ code: "start_failed", context: { server: "sick" } });
    expect((err as Error).message).toContain("refusing to start");
  });

  it("refuses an invalid configuration with a typed error before starting anything", async () => {
    await expect(McpBridge.start({ servers: { "bad name!": { command: "x" } } })).rejects.toMatchObject({
      code: "invalid_config",
    });
  });

  it("a server closed by its host answers calls with a typed server_closed error", async () => {
    const bridge = await McpBridge.start({
      servers: { calc: { command: process.execPath, args: [server, "2"] } },
    });
    const add = bridge.tools()[0];
    await bridge.close();
    expect(bridge.servers()[0]?.running).toBe(false);
    await expect(add?.execute({ a: 1, b: 2 }, ctx)).rejects.toMatchObject({
      name: "McpError",
      code: "server_closed",
    });
  });

  it("many calls under one turn's signal leave no listener on it", async () => {
    const bridge = await McpBridge.start({
      servers: { calc: { command: process.execPath, args: [server, "2"] } },
    });
    open.push(bridge);
    const turn = new AbortController();
    const add = bridge.tools()[0];
    for (let i = 0; i < 25; i++) await add?.execute({ a: i, b: 1 }, { ...ctx, signal: turn.signal });
    expect(getEventListeners(turn.signal, "abort")).toHaveLength(0);
  });

  it("long names are cut to 64 characters with a digest; odd characters become underscores", () => {
    expect(bridgedToolName("s", "a.b c")).toBe("mcp__s__a_b_c");
    const long = bridgedToolName("server", "x".repeat(100));
    expect(long).toHaveLength(64);
    expect(bridgedToolName("server", `${"x".repeat(100)}y`)).not.toBe(long);
  });
});

/** Every bridge event in order; `next(type)` waits for the first one of that type not yet taken. */
function recorder() {
  const seen: McpBridgeEvent[] = [];
  const taken = new Set<McpBridgeEvent>();
  const waiters: Array<() => void> = [];
  return {
    seen,
    onEvent: (e: McpBridgeEvent) => {
      seen.push(e);
      for (const w of waiters.splice(0)) w();
    },
    async next<T extends McpBridgeEvent["type"]>(type: T): Promise<Extract<McpBridgeEvent, { type: T }>> {
      for (;;) {
        const e = seen.find((x) => x.type === type && !taken.has(x));
        if (e) {
          taken.add(e);
          return e as Extract<McpBridgeEvent, { type: T }>;
        }
        await new Promise<void>((r) => waiters.push(r));
      }
    },
  };
}

function pidOf(bridge: McpBridge): number {
  const pid = bridge.servers()[0]?.pid;
  if (typeof pid !== "number") throw new Error("server has no pid");
  return pid;
}

describe("a server that exits is restarted", () => {
  it("SIGKILLed: calls while down get server_closed at once, an in-flight call too; after the restart calls succeed again; a changed tool list is reported and the declared tools stay", async () => {
    const dir = scratch();
    const countFile = join(dir, "count");
    const events = recorder();
    const bridge = await McpBridge.start(
      {
        servers: {
          calc: {
            command: process.execPath,
            args: [server, "2"],
            env: { CRW_MCP_SLOW: "1", CRW_MCP_COUNT_FILE: countFile },
            restart: { maxAttempts: 3, initialDelayMs: 50, maxDelayMs: 1000 },
          },
        },
      },
      { onEvent: events.onEvent },
    );
    open.push(bridge);
    const names = bridge.tools().map((t) => t.name);
    expect(names).toEqual([
      "mcp__calc__add",
      "mcp__calc__echo",
      "mcp__calc__wait",
      "mcp__calc__cancellations",
    ]);
    const add = bridge.tools()[0];
    const wait = bridge.tools()[2];
    const first = pidOf(bridge);
    // The restarted server will list a third tool.
    writeFileSync(countFile, "3");
    const inFlight = wait?.execute({}, ctx).catch((e: unknown) => e);
    process.kill(first, "SIGKILL");
    expect(await inFlight).toMatchObject({ name: "McpError", code: "server_closed" });
    expect(await events.next("server_exited")).toMatchObject({ server: "calc", willRestart: true });
    expect(bridge.servers()[0]).toMatchObject({ state: "restarting", running: false, pid: null });
    await expect(add?.execute({ a: 1, b: 2 }, ctx)).rejects.toMatchObject({
      name: "McpError",
      code: "server_closed",
      context: { server: "calc", state: "restarting" },
    });
    const restarted = await events.next("server_restarted");
    expect(restarted).toMatchObject({
      server: "calc",
      attempt: 1,
      toolsChanged: true,
      toolsAdded: ["mcp__calc__probe_03"],
      toolsRemoved: [],
    });
    expect(restarted.pid).not.toBe(first);
    const out = await add?.execute({ a: 1, b: 2 }, ctx);
    expect(out?.content).toBe(`3 (pid ${restarted.pid})`);
    // The declared catalog is the one of the start: running sessions keep their tools.
    expect(bridge.tools().map((t) => t.name)).toEqual(names);
    expect(bridge.servers()[0]).toMatchObject({ state: "running", running: true, restarts: 1, attempts: 0 });
    // And a second death is survived the same way.
    process.kill(restarted.pid as number, "SIGKILL");
    await events.next("server_restarted");
    expect((await add?.execute({ a: 2, b: 2 }, ctx))?.content).toMatch(/^4 \(pid \d+\)$/);
    expect(bridge.servers()[0]?.restarts).toBe(2);
  });

  it("one that never comes back is retried with bounded exponential backoff, then stays down and says why", async () => {
    const dir = scratch();
    const block = join(dir, "block");
    const events = recorder();
    const bridge = await McpBridge.start(
      {
        servers: {
          calc: {
            command: process.execPath,
            args: [server, "2"],
            env: { CRW_MCP_FAIL_IF: block },
            restart: { maxAttempts: 3, initialDelayMs: 40, maxDelayMs: 100 },
          },
        },
      },
      { onEvent: events.onEvent },
    );
    open.push(bridge);
    writeFileSync(block, "");
    process.kill(pidOf(bridge), "SIGKILL");
    const failed = await events.next("server_failed");
    expect(failed).toMatchObject({ server: "calc", attempts: 3 });
    expect(failed.reason).toContain("refusing to start");
    const attempts = events.seen.filter((e) => e.type === "restart_failed");
    // Delays 40, 80, then capped at 100 (never used: the third attempt was the last).
    expect(attempts.map((e) => [e.attempt, e.nextDelayMs, e.error.code])).toEqual([
      [1, 80, "start_failed"],
      [2, 100, "start_failed"],
      [3, null, "start_failed"],
    ]);
    expect(bridge.servers()[0]).toMatchObject({ state: "failed", running: false, attempts: 3, pid: null });
    expect(bridge.servers()[0]?.lastError).toContain("refusing to start");
    const err = await bridge
      .tools()[0]
      ?.execute({ a: 1, b: 2 }, ctx)
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "server_closed", context: { state: "failed" } });
    expect((err as Error).message).toContain("refusing to start");
  });

  it("maxAttempts 0 never restarts: the exited server is failed at once", async () => {
    const events = recorder();
    const bridge = await McpBridge.start(
      {
        servers: {
          calc: { command: process.execPath, args: [server, "2"], restart: { maxAttempts: 0 } },
        },
      },
      { onEvent: events.onEvent },
    );
    open.push(bridge);
    process.kill(pidOf(bridge), "SIGKILL");
    expect(await events.next("server_exited")).toMatchObject({ willRestart: false });
    expect(await events.next("server_failed")).toMatchObject({ attempts: 0 });
    expect(bridge.servers()[0]).toMatchObject({ state: "failed", restarts: 0 });
  });

  it("a restart configuration whose maximum delay is below its initial delay is invalid_config", async () => {
    await expect(
      McpBridge.start({
        servers: { calc: { command: "x", restart: { initialDelayMs: 500, maxDelayMs: 100 } } },
      }),
    ).rejects.toMatchObject({ code: "invalid_config" });
  });
});

describe("calls that do not finish", () => {
  it("a call past the server's timeout is a typed call_timeout and is cancelled on the server; so is a call whose turn is aborted", async () => {
    const bridge = await McpBridge.start({
      servers: {
        slow: {
          command: process.execPath,
          args: [server, "2"],
          env: { CRW_MCP_SLOW: "1" },
          timeoutMs: 1500,
          startTimeoutMs: 30_000,
        },
      },
    });
    open.push(bridge);
    const [, , wait, cancellations] = bridge.tools();
    const err = await wait?.execute({}, ctx).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(McpError);
    expect(err).toMatchObject({ code: "call_timeout", context: { server: "slow", tool: "wait" } });
    const state = async () =>
      JSON.parse((await cancellations?.execute({}, ctx))?.content ?? "null") as {
        waiting: number;
        cancelled: string[];
      };
    // The server received notifications/cancelled for that request (it aborted its handler).
    expect(await state()).toMatchObject({ waiting: 0, cancelled: [expect.stringContaining("timed out")] });
    const turn = new AbortController();
    const aborted = wait?.execute({}, { ...ctx, signal: turn.signal }).catch((e: unknown) => e);
    // Aborted once the server is handling it (a request aborted before it is sent is never sent).
    while ((await state()).waiting === 0) await new Promise((r) => setTimeout(r, 20));
    turn.abort(new Error("turn interrupted"));
    expect(await aborted).toMatchObject({ code: "call_failed" });
    expect(await state()).toMatchObject({
      waiting: 0,
      cancelled: [expect.any(String), expect.stringContaining("turn interrupted")],
    });
    // The server is still up and answers.
    expect(bridge.servers()[0]?.running).toBe(true);
  });
});
