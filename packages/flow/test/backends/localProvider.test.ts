import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { captureDelegatedExecutionScope, modelConfigFor, runChildTurn } from "@crw/brain";
import { type ModelRequest, type ModelServer, startModelServer } from "@crw/tools/models";
import { scratchDir } from "@crw/tools/scratch";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { localModelConfig, providerFailureDetail } from "../../src/backends/localModel.js";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow } from "../../src/journal/rows.js";
import { checkSpec } from "../../src/run/spec.js";
import { tempRepo } from "../git/repo.js";
import { crwFlow, ensureBuilt, plainEnv, waitFor } from "../helpers/cli.js";

/**
 * The local backend against a user's own model server: the real provider clients of brain talk to the
 * model server of @crw/tools on 127.0.0.1, once per wire protocol, with the server's URL and the key's
 * variable given by flag, environment or config file.
 */
const KEY = "sk-local-provider-test";
let server: ModelServer;
let root: string;
let workflow: string;
/** A throw-away repository, so the refused starts' runs, had they been made, land nowhere else. */
let repo: string;

/** The server answers every packet with the JSON the one-call workflow asks for, naming its protocol. */
const answerOf = (q: ModelRequest) => ({ answer: `from the ${q.protocol} server`, model: q.model });

function rowsOf(state: string, run: string): JournalRow[] {
  return readJournalFile(join(state, "flow", run, "journal.jsonl")).rows;
}

function waitRow(state: string, run: string, type: string, timeoutMs = 60_000): Promise<JournalRow> {
  return waitFor(
    `a ${type} row of run ${run}`,
    () =>
      existsSync(join(state, "flow", run, "journal.jsonl")) &&
      rowsOf(state, run).find((r) => r.type === type),
    timeoutMs,
  );
}

const seenBy = (model: string) => server.requests.filter((q) => q.model === model);

async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((ok) => s.listen(0, "127.0.0.1", ok));
  const { port } = s.address() as { port: number };
  await new Promise<void>((ok) => s.close(() => ok()));
  return port;
}

beforeAll(async () => {
  ensureBuilt();
  server = await startModelServer((q) => ({ text: JSON.stringify(answerOf(q)) }));
  root = scratchDir("crw-flow-provider-");
  repo = tempRepo("crw-flow-provider-repo-").repo;
  workflow = join(root, "ask.workflow.mjs");
  writeFileSync(
    workflow,
    `export default {
  name: "ask",
  async run(ctx) {
    return ctx.call({
      role: "explorer",
      node: "ask",
      task: "Answer with the JSON object the contract names.",
      schema: {
        type: "object",
        properties: { answer: { type: "string" }, model: { type: "string" } },
        required: ["answer", "model"],
        additionalProperties: false,
      },
    });
  },
};
`,
  );
}, 180_000);

afterAll(async () => {
  await server?.close();
});

/**
 * Starts the workflow on the local backend in a fresh state directory and a throw-away repository of its
 * own (the runs of this file's tests run side by side); `setup` may write into the state directory first.
 */
async function start(run: string, args: string[], env: NodeJS.ProcessEnv, setup?: (state: string) => void) {
  const state = mkdtempSync(join(root, `${run}-`));
  const repo = tempRepo("crw-flow-provider-repo-").repo;
  setup?.(state);
  const r = await crwFlow(
    [
      "start",
      workflow,
      "--backend",
      "local",
      "--state",
      state,
      "--run",
      run,
      "--repo",
      repo,
      "--json",
      ...args,
    ],
    env,
  );
  return { state, r };
}

describe.concurrent("the local backend with the user's own model server", () => {
  const cases = [
    {
      protocol: "openai-completions",
      how: "flags",
      model: "openai-completions:probe-flag",
      key: "FLOW_TEST_KEY_FLAG",
      args: (url: string) => [
        "--model",
        "openai-completions:probe-flag",
        "--model-base-url",
        url,
        "--model-api-key-env",
        "FLOW_TEST_KEY_FLAG",
      ],
      env: () => ({}),
      url: () => server.openaiBaseUrl,
      header: (q: ModelRequest) => q.headers.authorization,
      sent: `Bearer ${KEY}`,
    },
    {
      protocol: "openai-responses",
      how: "environment",
      model: "openai-responses:probe-env",
      key: "FLOW_TEST_KEY_ENV",
      args: () => [],
      env: (url: string) => ({
        CRW_MODEL: "openai-responses:probe-env",
        CRW_MODEL_BASE_URL: url,
        CRW_MODEL_API_KEY_ENV: "FLOW_TEST_KEY_ENV",
      }),
      url: () => server.openaiBaseUrl,
      header: (q: ModelRequest) => q.headers.authorization,
      sent: `Bearer ${KEY}`,
    },
    {
      protocol: "anthropic-messages",
      how: "the state directory's config.json",
      model: "anthropic-messages:probe-file",
      key: "FLOW_TEST_KEY_FILE",
      args: () => [],
      env: () => ({}),
      url: () => server.anthropicBaseUrl,
      header: (q: ModelRequest) => q.headers["x-api-key"],
      sent: KEY,
    },
  ] as const;

  for (const c of cases) {
    it(`${c.protocol}: server and key variable from ${c.how}; the call's answer is the server's, the spec records the server and the variable, never the key`, async () => {
      const url = c.url();
      const { state, r } = await start(
        c.protocol,
        [...c.args(url)],
        plainEnv({ ...c.env(url), [c.key]: KEY }),
        (dir) => {
          if (c.how !== "the state directory's config.json") return;
          const models = {
            default: c.model,
            baseUrls: { [c.protocol]: url },
            apiKeyEnv: { [c.protocol]: c.key },
          };
          writeFileSync(join(dir, "config.json"), JSON.stringify({ models }));
        },
      );
      expect(r.code, r.stderr).toBe(0);
      expect(r.json()).toMatchObject({ model: c.model, model_base_url: url, model_api_key_env: c.key });
      const end = await waitRow(state, c.protocol, "run_ended");
      const expected = { answer: `from the ${c.protocol} server`, model: c.model.split(":")[1] };
      expect(end).toMatchObject({ status: "completed", result: expected });
      const completed = rowsOf(state, c.protocol).find((row) => row.type === "completed");
      expect(completed).toMatchObject({ call: "ask.1", result: expected });
      const seen = seenBy(c.model.split(":")[1] as string);
      expect(seen.length).toBeGreaterThan(0);
      for (const q of seen) {
        expect(q.protocol).toBe(c.protocol);
        expect(c.header(q)).toBe(c.sent);
      }
      const spec = readFileSync(join(state, "flow", c.protocol, "run.json"), "utf8");
      expect(JSON.parse(spec).local).toEqual({
        model: c.model,
        script: null,
        base_url: url,
        api_key_env: c.key,
      });
      expect(spec).not.toContain(KEY);
    }, 90_000);
  }

  it("a flag beats the environment, which beats the --config file; the model comes from the file's default", async () => {
    const down = `http://127.0.0.1:${await closedPort()}/v1`;
    const config = join(root, "order.json");
    const models = {
      default: "openai-completions:probe-order",
      baseUrls: { "openai-completions": `${down}/file` },
      apiKeyEnv: { "openai-completions": "FLOW_TEST_KEY_IN_FILE" },
    };
    writeFileSync(config, JSON.stringify({ models }));
    const env = plainEnv({
      CRW_MODEL_BASE_URL: `${down}/env`,
      CRW_MODEL_API_KEY_ENV: "FLOW_TEST_KEY_IN_ENV",
      FLOW_TEST_KEY_IN_ENV: KEY,
    });
    const fromEnv = await start("order-env", ["--config", config], env);
    expect(fromEnv.r.code, fromEnv.r.stderr).toBe(0);
    expect(fromEnv.r.json()).toMatchObject({
      model: "openai-completions:probe-order",
      model_base_url: `${down}/env`,
      model_api_key_env: "FLOW_TEST_KEY_IN_ENV",
    });
    const flags = ["--model-base-url", server.openaiBaseUrl, "--model-api-key-env", "FLOW_TEST_KEY_IN_FLAG"];
    const fromFlags = await start("order-flag", ["--config", config, ...flags], {
      ...env,
      FLOW_TEST_KEY_IN_FLAG: KEY,
    });
    expect(fromFlags.r.code, fromFlags.r.stderr).toBe(0);
    const end = await waitRow(fromFlags.state, "order-flag", "run_ended");
    expect(end).toMatchObject({ status: "completed", result: { model: "probe-order" } });
    for (const q of seenBy("probe-order")) expect(q.headers.authorization).toBe(`Bearer ${KEY}`);
    // the first run's call is held at the environment's (unreachable) server: it went nowhere else
    const held = await waitRow(fromEnv.state, "order-env", "held");
    expect(held.type === "held" && held.detail).toContain(`${down}/env`);
  }, 90_000);

  it("a resume reaches the recorded server with the recorded key variable, with no provider settings in its environment", async () => {
    const model = "openai-completions:probe-resume";
    const url = server.openaiBaseUrl;
    const { state, r } = await start(
      "resume",
      ["--model", model, "--model-base-url", url, "--model-api-key-env", "FLOW_TEST_KEY_RESUME"],
      plainEnv({ FLOW_TEST_KEY_RESUME: KEY, CRW_FLOW_FAULT: "after:turn_started:1" }),
    );
    expect(r.code, r.stderr).toBe(0);
    const pid = Number(r.json().pid);
    await waitFor(
      "the run process to die at its fault point",
      () => {
        try {
          process.kill(pid, 0);
          return false;
        } catch {
          return true;
        }
      },
      30_000,
    );
    expect(rowsOf(state, "resume").some((row) => row.type === "completed")).toBe(false);
    const before = seenBy("probe-resume").length;
    const resumed = await crwFlow(
      ["resume", "resume", "--state", state],
      plainEnv({ FLOW_TEST_KEY_RESUME: KEY }),
    );
    expect(resumed.code, resumed.stderr).toBe(0);
    const rows = rowsOf(state, "resume");
    expect(rows.find((row) => row.type === "completed")).toMatchObject({
      attempt: 2,
      result: { answer: "from the openai-completions server", model: "probe-resume" },
    });
    const after = seenBy("probe-resume").slice(before);
    expect(after.length).toBeGreaterThan(0);
    for (const q of after) expect(q.headers.authorization).toBe(`Bearer ${KEY}`);
  }, 90_000);

  it("a server that cannot be reached holds the call (provider_failure) with the base URL in the detail", async () => {
    const url = `http://127.0.0.1:${await closedPort()}/v1`;
    const { state, r } = await start(
      "unreachable",
      [
        "--model",
        "openai-completions:probe-down",
        "--model-base-url",
        url,
        "--model-api-key-env",
        "FLOW_TEST_KEY_DOWN",
      ],
      plainEnv({ FLOW_TEST_KEY_DOWN: KEY }),
    );
    expect(r.code, r.stderr).toBe(0);
    const held = await waitRow(state, "unreachable", "held");
    expect(held).toMatchObject({ call: "ask.1", reason: "provider_failure" });
    expect(held.type === "held" && held.detail).toContain(url);
    await waitRow(state, "unreachable", "run_paused");
  }, 90_000);

  it("bad provider settings exit 2 with a typed message naming the value's source, and create no run", async () => {
    const state = mkdtempSync(join(root, "bad-"));
    const file = (name: string, content: string) => {
      const path = join(root, name);
      writeFileSync(path, content);
      return path;
    };
    const brokenJson = file("broken.json", "{ not json");
    const badUrl = file(
      "bad-url.json",
      JSON.stringify({ models: { baseUrls: { "openai-completions": "nowhere" } } }),
    );
    const badApi = file("bad-api.json", JSON.stringify({ models: { apiKeyEnv: { gemini: "KEY" } } }));
    const badKey = file(
      "bad-key.json",
      JSON.stringify({ models: { apiKeyEnv: { "anthropic-messages": "my-key" } } }),
    );
    const m = ["--model", "openai-completions:x"];
    const cases: { args: string[]; env?: NodeJS.ProcessEnv; message: RegExp }[] = [
      {
        args: [...m, "--model-base-url", "not-a-url"],
        message: /--model-base-url 'not-a-url' is not an http\(s\) URL/,
      },
      { args: [...m, "--model-base-url", "ftp://host/v1"], message: /is not an http\(s\) URL/ },
      {
        args: [...m, "--model-api-key-env", "my-key"],
        message: /--model-api-key-env 'my-key' is not an environment variable name/,
      },
      { args: ["--model", "gemini:pro"], message: /--model gemini:pro: not a model/ },
      { args: [], env: { CRW_MODEL: "gemini:pro" }, message: /CRW_MODEL gemini:pro: not a model/ },
      {
        args: m,
        env: { CRW_MODEL_BASE_URL: "localhost" },
        message: /CRW_MODEL_BASE_URL 'localhost' is not an http\(s\) URL/,
      },
      {
        args: ["--model-base-url", "http://127.0.0.1:1/v1"],
        message: /go with a provider model, not scripted/,
      },
      {
        args: [...m, "--config", join(root, "missing.json")],
        message: /config file .*missing\.json: cannot read it as JSON/,
      },
      { args: [...m, "--config", brokenJson], message: /config file .*broken\.json: cannot read it as JSON/ },
      {
        args: m,
        env: { CRW_FLOW_CONFIG: badUrl },
        message: /bad-url\.json: models\.baseUrls\.openai-completions: not an http\(s\) URL/,
      },
      { args: [...m, "--config", badApi], message: /bad-api\.json: models\.apiKeyEnv: .*gemini/ },
      {
        args: ["--config", badKey],
        message: /bad-key\.json: models\.apiKeyEnv\.anthropic-messages: not an environment variable name/,
      },
      {
        args: ["--backend", "session", "--owner", "t-1", "--model-base-url", "http://127.0.0.1:1/v1"],
        message: /are options of --backend local/,
      },
    ];
    for (const c of cases) {
      const r = await crwFlow(
        ["start", workflow, "--state", state, "--repo", repo, "--json", ...c.args],
        plainEnv(c.env),
      );
      const what = `${c.args.join(" ")} ${JSON.stringify(c.env ?? {})}: ${r.stdout}${r.stderr}`;
      expect(r.code, what).toBe(2);
      expect(r.json(), what).toMatchObject({ error: { code: "input" } });
      expect(String((r.json().error as { message: string }).message), what).toMatch(c.message);
    }
    // the state directory's own config.json is read as well, and a bad one refuses the start
    writeFileSync(join(state, "config.json"), JSON.stringify({ model: "openai-completions:x" }));
    const implicit = await crwFlow(
      ["start", workflow, "--state", state, "--repo", repo, "--json"],
      plainEnv(),
    );
    expect(implicit.code).toBe(2);
    expect(String((implicit.json().error as { message: string }).message)).toMatch(/config\.json: .*model/);
    mkdirSync(join(state, "flow"), { recursive: true });
    expect(readdirSync(join(state, "flow"))).toEqual([]);
  }, 90_000);
});

describe("the model server's OpenAI Responses protocol", () => {
  it("brain's openai-responses client runs a tool round and a final answer against it, the key in the header", async () => {
    const dir = scratchDir("crw-responses-");
    writeFileSync(join(dir, "a.txt"), "contents of a");
    const responses = await startModelServer((q) =>
      q.toolResults.length === 0
        ? { tool: { name: "read", arguments: { path: "a.txt" } } }
        : { text: `the file says: ${q.toolResults[0]?.text}` },
    );
    try {
      const out = await runChildTurn({
        sessionId: "s-responses",
        systemPrompt: "SYSTEM-MARKER",
        messages: [],
        input: "read a.txt",
        scope: captureDelegatedExecutionScope({
          accountId: "a",
          target: { kind: "host", ref: null },
          workDir: dir,
          tools: { allow: ["read"] },
        }),
        workDir: dir,
        model: {
          api: "openai-responses",
          modelId: "probe-unit",
          baseUrl: responses.openaiBaseUrl,
          apiKey: KEY,
        },
      });
      expect(out.stopReason).toBe("stop");
      expect(out.finalText).toBe("the file says: contents of a");
      expect(out.toolCalls.map((t) => [t.toolName, t.result])).toEqual([["read", "contents of a"]]);
      expect(out.usage).toMatchObject({ providerCalls: 2, input: 40, output: 10, totalTokens: 50 });
      expect(responses.requests).toHaveLength(2);
      const [first, second] = responses.requests;
      expect(first).toMatchObject({
        protocol: "openai-responses",
        model: "probe-unit",
        userTexts: ["read a.txt"],
      });
      expect(first?.system).toContain("SYSTEM-MARKER");
      expect(first?.tools).toEqual(["read"]);
      expect(first?.headers.authorization).toBe(`Bearer ${KEY}`);
      expect(second?.toolResults).toEqual([{ text: "contents of a", isError: false }]);
    } finally {
      await responses.close();
    }
  });
});

describe("the spec's local provider", () => {
  const spec = (local: Record<string, unknown>) => ({
    format: "crw-flow-run/1",
    run_id: "r",
    workflow: "/w.mjs",
    workflow_name: "w",
    input: null,
    backend: "local",
    owner: null,
    local: { model: "openai-responses:m", script: null, ...local },
    pool: 1,
    repo: "/repo",
    host: "",
    created_at: "2026-01-01T00:00:00.000Z",
  });

  it("is checked on read: a base URL that is no http(s) URL or a key variable that is no name is refused", () => {
    expect(checkSpec(spec({ base_url: "http://127.0.0.1:1/v1", api_key_env: "MY_KEY" })).local).toMatchObject(
      {
        base_url: "http://127.0.0.1:1/v1",
        api_key_env: "MY_KEY",
      },
    );
    expect(() => checkSpec(spec({ base_url: "file:///etc" }))).toThrow(
      /local\.base_url is not an http\(s\) URL/,
    );
    expect(() => checkSpec(spec({ api_key_env: "my key" }))).toThrow(
      /local\.api_key_env is not an environment/,
    );
  });

  it("becomes brain's model configuration for the recorded API only; the held detail names the server", () => {
    const local = { model: "openai-responses:m", script: null, base_url: "http://h:1/v1", api_key_env: "K" };
    expect(localModelConfig(local, { modelConfigFor })).toEqual({
      api: "openai-responses",
      modelId: "m",
      baseUrl: "http://h:1/v1",
      apiKeyEnv: "K",
    });
    expect(localModelConfig({ model: "anthropic-messages:c", script: null }, { modelConfigFor })).toEqual({
      api: "anthropic-messages",
      modelId: "c",
    });
    expect(providerFailureDetail("Connection error.", local)).toBe(
      "Connection error. (model server http://h:1/v1)",
    );
    expect(providerFailureDetail("Connection error.", { model: "openai-responses:m", script: null })).toBe(
      "Connection error.",
    );
  });
});
