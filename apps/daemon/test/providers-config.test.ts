import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../src/index.js";

const dir = () => scratchDir("crw-config-models-");

describe("provider configuration", () => {
  it("defaults: the offline scripted provider, runners on (S004-440)", () => {
    const c = loadConfig({ env: { CRW_DAEMON_DIR: dir() } });
    expect(c.models).toEqual({ default: "scripted", baseUrls: {}, apiKeyEnv: {} });
    expect(c.runtime).toMatchObject({ subagentRunnerEnabled: true, turnsPerRunner: 4 });
  });

  it("a real provider from the environment: model id, base URL and the key's variable for that model's API", () => {
    const c = loadConfig({
      env: {
        CRW_DAEMON_DIR: dir(),
        CRW_MODEL: "openai-completions:my-model",
        CRW_MODEL_BASE_URL: "http://127.0.0.1:8000/v1",
        CRW_MODEL_API_KEY_ENV: "MY_KEY",
      },
    });
    expect(c.models).toEqual({
      default: "openai-completions:my-model",
      baseUrls: { "openai-completions": "http://127.0.0.1:8000/v1" },
      apiKeyEnv: { "openai-completions": "MY_KEY" },
    });
  });

  it("the file's models section merges with the environment; flags win", () => {
    const dataDir = dir();
    writeFileSync(
      join(dataDir, "daemon.json"),
      JSON.stringify({
        models: {
          default: "anthropic-messages:claude-x",
          apiKeyEnv: { "anthropic-messages": "ANTHROPIC_KEY_FILE" },
        },
      }),
    );
    const c = loadConfig({
      env: { CRW_DAEMON_DIR: dataDir },
      overrides: { models: { default: "scripted" } },
    });
    expect(c.models).toEqual({
      default: "scripted",
      baseUrls: {},
      apiKeyEnv: { "anthropic-messages": "ANTHROPIC_KEY_FILE" },
    });
  });

  it("bad provider settings are typed configuration errors naming what is wrong", () => {
    const base = { CRW_DAEMON_DIR: dir() };
    expect(() => loadConfig({ env: { ...base, CRW_MODEL: "gpt-4o" } })).toThrow(/names no known API/);
    expect(() =>
      loadConfig({ env: { ...base, CRW_MODEL: "openai-responses:x", CRW_MODEL_BASE_URL: "not a url" } }),
    ).toThrow(ConfigError);
    const dataDir = dir();
    writeFileSync(
      join(dataDir, "daemon.json"),
      JSON.stringify({ models: { baseUrls: { "made-up": "http://x" } } }),
    );
    expect(() => loadConfig({ env: { CRW_DAEMON_DIR: dataDir } })).toThrow(ConfigError);
    writeFileSync(
      join(dataDir, "daemon.json"),
      JSON.stringify({ models: { apiKeyEnv: { "openai-responses": "bad name" } } }),
    );
    expect(() => loadConfig({ env: { CRW_DAEMON_DIR: dataDir } })).toThrow(/apiKeyEnv/);
  });
});
