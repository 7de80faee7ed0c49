import { readFileSync } from "node:fs";
import { pino } from "pino";
import {
  type Daemon,
  type DaemonConfigInput,
  loadConfig,
  ownerTokenPath,
  type StartDaemonOptions,
  startDaemon,
} from "../../src/index.js";
import { TestClient } from "./client.js";

type ProviderApi = "openai-completions" | "openai-responses" | "anthropic-messages";

/**
 * A daemon in `dataDir` on the test database whose providers are model servers on loopback (each API's
 * key read from `keyVar`, which holds a stand-in secret), silent, with its owner's client connected.
 * `overrides` adds to or replaces the configuration (its `models` merged with the servers').
 */
export async function startTestDaemon(options: {
  databaseUrl: string;
  dataDir: string;
  baseUrls: Partial<Record<ProviderApi, string>>;
  keyVar: string;
  overrides?: DaemonConfigInput;
  start?: StartDaemonOptions;
}): Promise<{ daemon: Daemon; owner: TestClient }> {
  process.env[options.keyVar] = "loopback-secret";
  const { models, ...rest } = options.overrides ?? {};
  const apiKeyEnv = Object.fromEntries(Object.keys(options.baseUrls).map((api) => [api, options.keyVar]));
  const daemon = await startDaemon(
    loadConfig({
      env: { DATABASE_URL: options.databaseUrl },
      overrides: {
        dataDir: options.dataDir,
        port: 0,
        logLevel: "silent",
        ...rest,
        models: { ...models, baseUrls: options.baseUrls, apiKeyEnv },
      },
    }),
    { log: pino({ level: "silent" }), ...options.start },
  );
  const token = readFileSync(ownerTokenPath(options.dataDir), "utf8").trim();
  return { daemon, owner: await TestClient.connect(daemon.state.url, token) };
}
