import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { MCP_TOOLS_SERVER } from "@crw/tools/mcp";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig, readState, startDaemon } from "../src/index.js";
import { ownerHealth } from "./support/health.js";
import { spawnDaemon } from "./support/process.js";

/**
 * MCP servers and the tool catalog policy in the daemon's configuration: the bridged servers start with
 * the daemon (before the delegation core), /health shows each with its tool count, and a server that
 * cannot start fails the daemon's start with a typed error naming it.
 */
const db = useTestDatabase();
const SERVER = MCP_TOOLS_SERVER;
const silent = pino({ level: "silent" });
/** The test server processes this process started (the in-process daemon's children), by tool count. */
function serverPids(count: string): number[] {
  return readdirSync("/proc")
    .filter((d) => /^\d+$/.test(d))
    .filter((pid) => {
      try {
        const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
        const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
        const argv = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
        return ppid === process.pid && argv.includes(SERVER) && argv.includes(count);
      } catch {
        return false;
      }
    })
    .map(Number);
}

describe("daemon configuration: mcp, tools, shutdownCheckpointMs", () => {
  it("reads MCP servers, the catalog policy and the checkpoint deadline from the file; refuses bad ones", () => {
    const dataDir = scratchDir("crw-mcp-config-");
    const c0 = loadConfig({ env: { CRW_DAEMON_DIR: dataDir } });
    expect(c0.mcp).toEqual({ servers: {} });
    expect(c0.tools).toEqual({});
    expect(c0.shutdownCheckpointMs).toBe(30_000);
    writeFileSync(
      join(dataDir, "daemon.json"),
      JSON.stringify({
        mcp: { servers: { calc: { command: "node", args: [SERVER, "2"] } } },
        tools: { maxDirectTools: 12 },
        shutdownCheckpointMs: 2_000,
      }),
    );
    const c = loadConfig({ env: { CRW_DAEMON_DIR: dataDir } });
    expect(c.mcp.servers?.calc).toMatchObject({ command: "node", args: [SERVER, "2"], readOnly: false });
    expect(c.tools).toEqual({ maxDirectTools: 12 });
    expect(c.shutdownCheckpointMs).toBe(2_000);
    expect(
      loadConfig({ env: { CRW_DAEMON_DIR: dataDir, CRW_SHUTDOWN_CHECKPOINT_MS: "500" } })
        .shutdownCheckpointMs,
    ).toBe(500);
    expect(() => loadConfig({ env: { CRW_DAEMON_DIR: dataDir, CRW_SHUTDOWN_CHECKPOINT_MS: "5" } })).toThrow(
      /CRW_SHUTDOWN_CHECKPOINT_MS/,
    );
    for (const bad of [
      { mcp: { servers: { "bad name!": { command: "node" } } } },
      { mcp: { servers: { calc: { command: "node", shell: true } } } },
      { tools: { maxDirectTools: -1 } },
      { tools: { deferAll: true } },
      { shutdownCheckpointMs: 0 },
    ]) {
      writeFileSync(join(dataDir, "daemon.json"), JSON.stringify(bad));
      expect(() => loadConfig({ env: { CRW_DAEMON_DIR: dataDir } }), JSON.stringify(bad)).toThrow(
        ConfigError,
      );
    }
  });
});

describe("MCP servers in the daemon", { timeout: 120_000 }, () => {
  it("starts every configured server with the daemon; /health shows each with its tool count, whether it runs, its restarts and why it stays down", async () => {
    const dataDir = scratchDir("crw-mcp-health-");
    const block = join(scratchDir("crw-mcp-block-"), "block");
    const daemon = await startDaemon(
      loadConfig({
        env: { DATABASE_URL: db.url },
        overrides: {
          dataDir,
          port: 0,
          runtime: { maxRunners: 1 },
          mcp: {
            servers: {
              // Never comes back once `block` exists: two attempts, then it stays down.
              wide: {
                command: process.execPath,
                args: [SERVER, "12"],
                env: { CRW_MCP_FAIL_IF: block },
                restart: { maxAttempts: 2, initialDelayMs: 20, maxDelayMs: 40 },
              },
              calc: {
                command: process.execPath,
                args: [SERVER, "2"],
                readOnly: true,
                restart: { initialDelayMs: 20 },
              },
            },
          },
        },
      }),
      { log: silent },
    );
    type Health = {
      mcp: {
        servers: {
          name: string;
          running: boolean;
          state: string;
          restarts: number;
          lastError: string | null;
        }[];
      };
    };
    const health = async () => (await ownerHealth(daemon.state.url, daemon.config.dataDir)) as Health;
    const server = async (name: string, holds: (s: Health["mcp"]["servers"][number]) => boolean) => {
      const until = Date.now() + 30_000;
      for (;;) {
        const s = (await health()).mcp.servers.find((x) => x.name === name);
        if (s && holds(s)) return s;
        if (Date.now() > until) throw new Error(`MCP server ${name}: ${JSON.stringify(s)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    try {
      expect((await health()).mcp).toEqual({
        servers: [
          {
            name: "calc",
            tools: 2,
            running: true,
            state: "running",
            restarts: 0,
            attempts: 0,
            lastError: null,
          },
          {
            name: "wide",
            tools: 12,
            running: true,
            state: "running",
            restarts: 0,
            attempts: 0,
            lastError: null,
          },
        ],
      });
      // A killed server is restarted: /health shows it running again with one restart.
      const calc = serverPids("2");
      expect(calc).toHaveLength(1);
      process.kill(calc[0] as number, "SIGKILL");
      await server("calc", (s) => s.running && s.restarts === 1);
      expect(serverPids("2")).not.toEqual(calc);
      // One that cannot start again stays down after its attempts, and /health says why.
      writeFileSync(block, "");
      const wide = serverPids("12");
      expect(wide).toHaveLength(1);
      process.kill(wide[0] as number, "SIGKILL");
      const down = await server("wide", (s) => s.state === "failed");
      expect(down).toMatchObject({ running: false, attempts: 2, restarts: 0 });
      expect(down.lastError).toContain("refusing to start");
      expect((await server("calc", () => true)).running).toBe(true);
    } finally {
      await daemon.stop();
    }
  });

  it("a server that cannot start fails the daemon's start: typed McpError naming the server, nonzero exit, nothing left listening", async () => {
    const dataDir = scratchDir("crw-mcp-fail-");
    writeFileSync(
      join(dataDir, "daemon.json"),
      JSON.stringify({
        mcp: {
          servers: {
            calc: { command: process.execPath, args: [SERVER, "2"] },
            broken: { command: process.execPath, args: [SERVER, "2"], env: { CRW_MCP_FAIL: "start" } },
          },
        },
      }),
    );
    await expect(spawnDaemon({ dataDir, databaseUrl: db.url, logLevel: "info" })).rejects.toThrow(
      /did not come up \(exit 1\).*McpError.*MCP server broken .*could not start.*refusing to start/s,
    );
    expect(await readState(dataDir)).toBeUndefined();
    // The same in process: the typed error names the server.
    const error = await startDaemon(
      loadConfig({ env: { DATABASE_URL: db.url }, overrides: { dataDir, port: 0 } }),
      { log: silent },
    ).catch((e: unknown) => e);
    expect(error).toMatchObject({ name: "McpError", code: "start_failed", context: { server: "broken" } });
    expect(await readState(dataDir)).toBeUndefined();
  });
});
