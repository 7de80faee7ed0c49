import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { type ModelReply, type ModelRequest, type ModelServer, startModelServer } from "@crw/tools/models";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * `crw mcp` as an MCP client meets it: the SDK's own client starts the server over stdio, the server starts
 * the daemon on its data directory, and sub-agents run on a model server of the test's speaking OpenAI Chat
 * Completions. What a child writes lands in the directory it was given.
 */
const run = promisify(execFile);
const bin = resolve(import.meta.dirname, "../bin/crw.mjs");
const root = mkdtempSync(join(tmpdir(), "crw-mcp-"));
const dataDir = join(root, "daemon");
const work = join(root, "work");
const KEY = "CRW_MCP_TEST_KEY";
let models: ModelServer;

/** A child asked to "write FILE: TEXT" writes it with its write tool, then answers. */
function answer(request: ModelRequest): ModelReply {
  const task = request.userTexts.join("\n");
  const write = /write (\S+): (.+)/.exec(task);
  if (request.toolResults.length > 0) return { text: `wrote ${write?.[1] ?? "nothing"}` };
  if (write) return { tool: { name: "write", arguments: { path: write[1], content: `${write[2]}\n` } } };
  return { text: `answered: ${task.slice(0, 60)}` };
}

function env(): Record<string, string> {
  const e: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined && k !== "DATABASE_URL") e[k] = v;
  return {
    ...e,
    CRW_MODEL: "openai-completions:loopback",
    CRW_MODEL_BASE_URL: models.openaiBaseUrl,
    CRW_MODEL_API_KEY_ENV: KEY,
    [KEY]: "secret",
    ...(process.env.DATABASE_URL ? { DATABASE_URL: process.env.DATABASE_URL } : {}),
  };
}

interface Served {
  client: Client;
  transport: StdioClientTransport;
  stderr: () => string;
}

async function serve(session = "mcp-test"): Promise<Served> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [bin, "mcp", "--data-dir", dataDir, "--session", session],
    cwd: work,
    env: env(),
    stderr: "pipe",
  });
  let stderr = "";
  transport.stderr?.on("data", (d: Buffer) => {
    stderr += d.toString();
  });
  const client = new Client({ name: "crw-mcp-test", version: "1.0.0" });
  await client.connect(transport);
  return { client, transport, stderr: () => stderr };
}

type ToolResult = {
  content: { type: string; text: string }[];
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
};

async function call(s: Served, name: string, args: Record<string, unknown> = {}, onprogress?: () => void) {
  return (await s.client.callTool({ name, arguments: args }, undefined, {
    timeout: 120_000,
    ...(onprogress && { onprogress }),
  })) as ToolResult;
}

const text = (r: ToolResult) => r.content.map((c) => c.text).join("\n");
/** The children whose results a `results` call gave. */
const resultChildren = (r: ToolResult) =>
  ((r.structuredContent?.results ?? []) as { childSessionId: string }[]).map((x) => x.childSessionId);
const daemonPid = () =>
  (JSON.parse(readFileSync(join(dataDir, "daemon.state.json"), "utf8")) as { pid: number }).pid;

async function settled(s: Served, child: string): Promise<void> {
  const until = Date.now() + 60_000;
  for (;;) {
    const st = await call(s, "status");
    const children = (st.structuredContent?.children ?? []) as {
      childSessionId: string;
      run: { status: string };
    }[];
    if (children.find((c) => c.childSessionId === child)?.run.status === "succeeded") return;
    if (Date.now() > until) throw new Error(`child ${child} did not settle: ${text(st)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

let first: Served;

beforeAll(async () => {
  mkdirSync(work, { recursive: true });
  models = await startModelServer(answer);
  first = await serve();
}, 120_000);

afterAll(async () => {
  await first?.client.close().catch(() => {});
  await run(process.execPath, [bin, "daemon", "stop", "--data-dir", dataDir], { env: env() }).catch(() => {});
  await models?.close();
  rmSync(root, { recursive: true, force: true });
}, 60_000);

describe("crw mcp", () => {
  it("offers its tools with schemas a model can fill in", async () => {
    const { tools } = await first.client.listTools();
    expect(tools.map((t) => t.name).sort()).toEqual(
      [
        "continue",
        "delegate",
        "land",
        "read",
        "results",
        "status",
        "workflow_cancel",
        "workflow_start",
        "workflow_status",
      ].sort(),
    );
    const delegate = tools.find((t) => t.name === "delegate");
    expect(delegate?.inputSchema.required).toEqual(["task"]);
    expect(Object.keys(delegate?.inputSchema.properties ?? {})).toEqual(
      expect.arrayContaining(["task", "cwd", "background", "isolation", "model", "read_only"]),
    );
  });

  it("a background delegation's answer is collected once through results, and its file is on disk", async () => {
    const started = await call(first, "delegate", {
      task: "write bg.txt: from the background",
      background: true,
    });
    expect(started.isError).toBeFalsy();
    const child = started.structuredContent?.childSessionId as string;
    const got = await call(first, "results", { wait_seconds: 60 });
    const results = got.structuredContent?.results as {
      childSessionId: string;
      body: string;
      alreadyTaken: boolean;
    }[];
    expect(results.map((r) => r.childSessionId)).toEqual([child]);
    expect(results[0]?.body).toContain("wrote bg.txt");
    expect(readFileSync(join(work, "bg.txt"), "utf8")).toBe("from the background\n");
    const again = await call(first, "results");
    expect(again.structuredContent?.results).toEqual([]);
  });

  it("a foreground delegation answers inline with progress, and results never gives that answer again", async () => {
    let progressed = 0;
    const r = await call(first, "delegate", { task: "write fg.txt: in the foreground" }, () => {
      progressed++;
    });
    expect(r.isError).toBeFalsy();
    expect(text(r)).toContain("wrote fg.txt");
    expect(progressed).toBeGreaterThan(0);
    expect(existsSync(join(work, "fg.txt"))).toBe(true);
    expect((await call(first, "results")).structuredContent?.results).toEqual([]);
  });

  it("refuses bad arguments with a message naming the argument", async () => {
    const r = await call(first, "delegate", { task: "", colour: "blue" });
    expect(r.isError).toBe(true);
    expect(text(r)).toMatch(/invalid arguments for delegate: .*task/);
    const land = await call(first, "land", {});
    expect(text(land)).toContain("exactly one of child and workflow");
    const results = await call(first, "results", { include_taken_since: "yesterday" });
    expect(results.isError).toBe(true);
  });

  it("a result settled before the daemon was SIGKILLed is given once after it starts again", async () => {
    const started = await call(first, "delegate", { task: "answer before the crash", background: true });
    const child = started.structuredContent?.childSessionId as string;
    await settled(first, child);
    process.kill(daemonPid(), "SIGKILL");
    // The MCP server finds no daemon, starts one on the same data directory, and finds its session again.
    const got = await call(first, "results", { wait_seconds: 30 });
    expect(resultChildren(got)).toEqual([child]);
    expect((await call(first, "results")).structuredContent?.results).toEqual([]);
  }, 120_000);

  it("a result the MCP server returned before it was SIGKILLed is not given again, only on asking for the taken", async () => {
    const since = new Date().toISOString();
    const started = await call(first, "delegate", { task: "answer then lose the server", background: true });
    const child = started.structuredContent?.childSessionId as string;
    const got = await call(first, "results", { wait_seconds: 60 });
    expect(resultChildren(got)).toEqual([child]);
    const pid = first.transport.pid as number;
    process.kill(pid, "SIGKILL");
    await first.client.close().catch(() => {});
    first = await serve();
    expect((await call(first, "results")).structuredContent?.results).toEqual([]);
    const seen = await call(first, "results", { include_taken_since: since });
    const again = seen.structuredContent?.results as { childSessionId: string; alreadyTaken: boolean }[];
    expect(again).toEqual([expect.objectContaining({ childSessionId: child, alreadyTaken: true })]);
    expect(text(seen)).toContain("1 already taken before");
    expect(again[0]).toHaveProperty("takenAt");
  }, 120_000);

  it("status lists the session's children with their directory, and read shows a child's answer", async () => {
    const st = await call(first, "status");
    const children = st.structuredContent?.children as {
      childSessionId: string;
      cwd: string;
      run: { status: string };
    }[];
    expect(children.length).toBeGreaterThanOrEqual(4);
    expect(children.every((c) => c.cwd === work && c.run.status === "succeeded")).toBe(true);
    const r = await call(first, "read", { child: children[0]?.childSessionId });
    expect(text(r)).toContain("latest answer: wrote bg.txt");
  });
});
