import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import {
  type Daemon,
  DaemonLockedError,
  loadConfig,
  ownerTokenPath,
  readState,
  startDaemon,
} from "../src/index.js";
import { ownerHealth } from "./support/health.js";

const silent = pino({ level: "silent" });

function connect(url: string, token?: string): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(
      `${url.replace("http", "ws")}/rpc`,
      token ? { headers: { authorization: `Bearer ${token}` } } : {},
    );
    ws.once("open", () => resolve(ws));
    ws.once("unexpected-response", (_req, res) => reject(new Error(`HTTP ${res.statusCode}`)));
    ws.once("error", reject);
  });
}

function call(ws: WebSocket, frame: object | string): Promise<Record<string, unknown>> {
  return new Promise((resolve) => {
    ws.once("message", (data) => resolve(JSON.parse(data.toString())));
    ws.send(typeof frame === "string" ? frame : JSON.stringify(frame));
  });
}

describe("the daemon on an external PostgreSQL", () => {
  const db = useTestDatabase();
  let daemon: Daemon;
  let dataDir: string;

  beforeAll(async () => {
    dataDir = scratchDir("crw-daemon-");
    daemon = await startDaemon(
      loadConfig({ env: { DATABASE_URL: db.url }, overrides: { dataDir, port: 0 } }),
      { log: silent },
    );
  });
  afterAll(async () => {
    await daemon?.stop();
  });

  it("publishes its state and answers /health with the database's state", async () => {
    const state = await readState(dataDir);
    expect(state).toMatchObject({ pid: process.pid, port: daemon.state.port, database: "external" });
    const health = (await ownerHealth(daemon.state.url, daemon.config.dataDir)) as Record<string, unknown>;
    expect(health).toMatchObject({ status: "ok", phase: "ready", database: { kind: "external", ok: true } });
  });

  it("refuses a WebSocket without a bearer token, or with a wrong one (401)", async () => {
    await expect(connect(daemon.state.url)).rejects.toThrow(/401/);
    await expect(connect(daemon.state.url, "crw_not-a-token")).rejects.toThrow(/401/);
  });

  it("answers JSON-RPC for the owner token it wrote at first start", async () => {
    const token = readFileSync(ownerTokenPath(dataDir), "utf8").trim();
    const ws = await connect(daemon.state.url, token);
    try {
      const who = await call(ws, { jsonrpc: "2.0", id: 1, method: "daemon.whoami", params: {} });
      expect(who).toMatchObject({ id: 1, result: { name: "owner", isOwner: true } });
      const bad = await call(ws, { jsonrpc: "2.0", id: 2, method: "daemon.whoami", params: { extra: true } });
      expect(bad).toMatchObject({ id: 2, error: { code: -32602, data: { code: "invalid_params" } } });
      const unknown = await call(ws, { jsonrpc: "2.0", id: 3, method: "nope" });
      expect(unknown).toMatchObject({ id: 3, error: { code: -32601, data: { code: "method_not_found" } } });
      const garbage = await call(ws, "{not json");
      expect(garbage).toMatchObject({ id: null, error: { code: -32700 } });
    } finally {
      ws.close();
    }
  });

  it("lets only one daemon run on a data directory", async () => {
    await expect(
      startDaemon(loadConfig({ env: { DATABASE_URL: db.url }, overrides: { dataDir, port: 0 } }), {
        log: silent,
      }),
    ).rejects.toBeInstanceOf(DaemonLockedError);
  });

  it("a graceful stop closes connections, removes its state and lock, and keeps the owner token", async () => {
    const token = readFileSync(ownerTokenPath(dataDir), "utf8").trim();
    const ws = await connect(daemon.state.url, token);
    const closed = new Promise<number>((r) => ws.once("close", (code) => r(code)));
    await daemon.stop("test");
    expect(await closed).toBe(1001);
    expect(await readState(dataDir)).toBeUndefined();
    expect(existsSync(join(dataDir, "daemon.lock"))).toBe(false);
    const again = await startDaemon(
      loadConfig({ env: { DATABASE_URL: db.url }, overrides: { dataDir, port: 0 } }),
      { log: silent },
    );
    try {
      expect(readFileSync(ownerTokenPath(dataDir), "utf8").trim()).toBe(token);
    } finally {
      await again.stop();
    }
  });
});
