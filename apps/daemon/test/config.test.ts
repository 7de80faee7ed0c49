import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../src/index.js";

const dir = () => scratchDir("crw-config-");

describe("daemon configuration", () => {
  it("has defaults that need no file and no environment", () => {
    const dataDir = dir();
    const c = loadConfig({ env: { CRW_DAEMON_DIR: dataDir } });
    expect(c).toMatchObject({ dataDir, host: "127.0.0.1", port: 7420, databaseUrl: undefined });
    expect(c.runtime.subagentRunnerEnabled).toBe(true);
  });

  it("reads <dataDir>/daemon.json, then the environment, then flags, each winning over the one before", () => {
    const dataDir = dir();
    writeFileSync(
      join(dataDir, "daemon.json"),
      JSON.stringify({ port: 9000, logLevel: "debug", runtime: { maxRunners: 3 } }),
    );
    const env = { CRW_DAEMON_DIR: dataDir, CRW_DAEMON_PORT: "9100", CRW_SUBAGENT_RUNNER_ENABLED: "false" };
    expect(loadConfig({ env })).toMatchObject({
      port: 9100,
      logLevel: "debug",
      runtime: { maxRunners: 3, subagentRunnerEnabled: false },
    });
    expect(loadConfig({ env, overrides: { port: 0 } }).port).toBe(0);
  });

  it("refuses a config file with an unknown or mistyped member, naming the file and the member", () => {
    const dataDir = dir();
    const file = join(dataDir, "custom.json");
    writeFileSync(file, JSON.stringify({ port: "eighty", colour: "blue" }));
    expect(() => loadConfig({ file, env: {} })).toThrow(ConfigError);
    try {
      loadConfig({ file, env: {} });
    } catch (e) {
      expect((e as Error).message).toContain(file);
      expect((e as Error).message).toMatch(/port|colour/);
    }
  });

  it("refuses a missing explicit file and malformed environment values", () => {
    expect(() => loadConfig({ file: join(dir(), "nope.json"), env: {} })).toThrow(/cannot read/);
    expect(() => loadConfig({ env: { CRW_DAEMON_DIR: dir(), CRW_DAEMON_PORT: "http" } })).toThrow(
      /CRW_DAEMON_PORT/,
    );
    expect(() =>
      loadConfig({ env: { CRW_DAEMON_DIR: dir(), CRW_SUBAGENT_RUNNER_ENABLED: "maybe" } }),
    ).toThrow(/CRW_SUBAGENT_RUNNER_ENABLED/);
  });

  it("the workflow engine's node cap comes from runtime.maxActiveNodes (file or CRW_MAX_ACTIVE_NODES), bounded", () => {
    const dataDir = dir();
    expect(loadConfig({ env: { CRW_DAEMON_DIR: dataDir } }).runtime.maxActiveNodes).toBeUndefined();
    writeFileSync(join(dataDir, "daemon.json"), JSON.stringify({ runtime: { maxActiveNodes: 6 } }));
    expect(loadConfig({ env: { CRW_DAEMON_DIR: dataDir } }).runtime.maxActiveNodes).toBe(6);
    expect(
      loadConfig({ env: { CRW_DAEMON_DIR: dataDir, CRW_MAX_ACTIVE_NODES: "3" } }).runtime.maxActiveNodes,
    ).toBe(3);
    expect(() => loadConfig({ env: { CRW_DAEMON_DIR: dataDir, CRW_MAX_ACTIVE_NODES: "0" } })).toThrow(
      /CRW_MAX_ACTIVE_NODES/,
    );
    writeFileSync(join(dataDir, "daemon.json"), JSON.stringify({ runtime: { maxActiveNodes: 0 } }));
    expect(() => loadConfig({ env: { CRW_DAEMON_DIR: dataDir } })).toThrow(ConfigError);
  });

  it("a foreground delegation's stall bound is 10 minutes unless daemon.json's stallAfterMs says otherwise (0: never)", () => {
    const dataDir = dir();
    expect(loadConfig({ env: { CRW_DAEMON_DIR: dataDir } }).stallAfterMs).toBe(600_000);
    writeFileSync(join(dataDir, "daemon.json"), JSON.stringify({ stallAfterMs: 0 }));
    expect(loadConfig({ env: { CRW_DAEMON_DIR: dataDir } }).stallAfterMs).toBe(0);
    writeFileSync(join(dataDir, "daemon.json"), JSON.stringify({ stallAfterMs: -1 }));
    expect(() => loadConfig({ env: { CRW_DAEMON_DIR: dataDir } })).toThrow(ConfigError);
  });
});
