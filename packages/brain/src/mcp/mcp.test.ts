import { getEventListeners } from "node:events";
import { resolve } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { bridgedToolName, McpBridge, McpError } from "./index.js";

const server = resolve(import.meta.dirname, "fixtures/tools-server.mjs");
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
afterEach(async () => {
  await Promise.all(open.splice(0).map((b) => b.close()));
});

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
    expect(bridge.servers()).toEqual([
      { name: "calc", tools: ["mcp__calc__add", "mcp__calc__echo"], running: true },
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

  it("a server that is gone answers calls with a typed server_closed error", async () => {
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
