import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { type ModelReply, type ModelRequest, type ModelServer, startModelServer } from "@crw/tools/models";
import { alive } from "@crw/tools/processes";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CRW_BIN as bin,
  callTool,
  daemonPid,
  modelEnv,
  resultChildren,
  type Served,
  serveMcp,
  text,
} from "./support/mcpClient.js";

/**
 * `crw mcp` as an MCP client meets it: the SDK's own client starts the server over stdio, the server starts
 * the daemon on its data directory, and sub-agents run on a model server of the test's speaking OpenAI Chat
 * Completions. What a child writes lands in the directory it was given.
 */
const run = promisify(execFile);
const root = mkdtempSync(join(tmpdir(), "crw-mcp-"));
const dataDir = join(root, "daemon");
const work = join(root, "work");
let models: ModelServer;

let releaseHeld: () => void = () => {};
const held = new Promise<void>((r) => {
  releaseHeld = r;
});
let heldAsked: () => void = () => {};
/** The held node's model request has reached the model server: its turn is running. */
const heldRunning = new Promise<void>((r) => {
  heldAsked = r;
});

/**
 * A child asked to "write FILE: TEXT" writes it with its write tool, then answers; "follow up: X" is
 * answered at once; a task with "hold" answers only once the test lets it.
 */
async function answer(request: ModelRequest): Promise<ModelReply> {
  const task = request.userTexts.join("\n");
  const follow = /^follow up: (.*)/.exec(request.userTexts.at(-1) ?? "");
  if (follow) return { text: `followed up: ${follow[1]}` };
  if (task.includes("hold the node")) {
    heldAsked();
    await held;
    return { text: "held no more" };
  }
  const write = /write (\S+): (.+)/.exec(task);
  if (request.toolResults.length > 0) return { text: `wrote ${write?.[1] ?? "nothing"}` };
  if (write) return { tool: { name: "write", arguments: { path: write[1], content: `${write[2]}\n` } } };
  return { text: `answered: ${task.slice(0, 60)}` };
}

const env = () => modelEnv(models.openaiBaseUrl);
const serve = (session = "mcp-test") => serveMcp({ dataDir, session, cwd: work, env: env() });
const call = callTool;

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
  releaseHeld();
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
    process.kill(daemonPid(dataDir), "SIGKILL");
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
  it("continue gives a child a follow-up and answers with its new answer", async () => {
    const started = await call(first, "delegate", { task: "answer and wait for more" });
    const child = started.structuredContent?.childSessionId as string;
    const r = await call(first, "continue", { child, text: "follow up: once more" });
    expect(r.isError).toBeFalsy();
    expect(r.structuredContent).toMatchObject({ childSessionId: child, body: "followed up: once more" });
    expect((await call(first, "results")).structuredContent?.results).toEqual([]);
  });

  it("a workflow started from a file runs its nodes, and its summary comes once through results", async () => {
    const file = join(work, "notes.yaml");
    writeFileSync(
      file,
      [
        "name: two-notes",
        "nodes:",
        "  - id: a",
        "    task: 'write wf-a.txt: node a'",
        "  - id: b",
        "    task: 'write wf-b.txt: node b'",
        "",
      ].join("\n"),
    );
    const started = await call(first, "workflow_start", { path: "notes.yaml" });
    expect(started.isError, text(started)).toBeFalsy();
    const workflow = started.structuredContent?.workflowId as string;
    const got = await call(first, "results", { wait_seconds: 60 });
    const results = got.structuredContent?.results as { kind: string; outcome: string; body: string }[];
    expect(results).toEqual([expect.objectContaining({ kind: "workflow_summary", outcome: "ok" })]);
    expect(readFileSync(join(work, "wf-a.txt"), "utf8")).toBe("node a\n");
    expect(readFileSync(join(work, "wf-b.txt"), "utf8")).toBe("node b\n");
    const st = await call(first, "workflow_status", { workflow });
    expect(st.structuredContent).toMatchObject({ status: "completed" });
    const listed = await call(first, "status");
    expect(listed.structuredContent?.workflows).toEqual(
      expect.arrayContaining([expect.objectContaining({ workflowId: workflow, status: "completed" })]),
    );
    expect((await call(first, "results")).structuredContent?.results).toEqual([]);
  });

  it("workflow_cancel stops a running workflow, its node's turn interrupted mid-request, and its cancelled summary comes through results", async () => {
    const definition = JSON.stringify({ name: "held", nodes: [{ id: "slow", task: "hold the node" }] });
    const started = await call(first, "workflow_start", { definition, format: "json" });
    const workflow = started.structuredContent?.workflowId as string;
    // The node's turn is waiting on its model, which never answers until the file ends: only an abort of
    // that turn ends the node and lets the workflow's cancellation finish.
    await heldRunning;
    const cancelled = await call(first, "workflow_cancel", { workflow });
    expect(cancelled.isError, text(cancelled)).toBeFalsy();
    const got = await call(first, "results", { wait_seconds: 60 });
    expect(got.structuredContent?.results).toEqual([
      expect.objectContaining({ kind: "workflow_summary", outcome: "error" }),
    ]);
    const [summary] = (got.structuredContent?.results ?? []) as { body: string }[];
    expect(summary?.body).toContain("- slow: interrupted while running");
    expect((await call(first, "workflow_status", { workflow })).structuredContent).toMatchObject({
      status: "cancelled",
      nodes: [expect.objectContaining({ id: "slow", status: "interrupted" })],
    });
  });

  it("land merges the branch of a child that worked in isolation into the branch it started from", async () => {
    const repo = join(work, "repo");
    mkdirSync(repo);
    const git = (...args: string[]) => run("git", ["-C", repo, ...args]);
    await git("init", "-q", "-b", "main");
    writeFileSync(join(repo, "README.md"), "a repository\n");
    await git("add", ".");
    await git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first");
    const r = await call(first, "delegate", {
      task: "write LANDED.md: from a branch",
      cwd: repo,
      isolation: "worktree",
    });
    expect(r.isError, text(r)).toBeFalsy();
    const child = r.structuredContent?.childSessionId as string;
    expect(existsSync(join(repo, "LANDED.md"))).toBe(false);
    const landed = await call(first, "land", { child });
    expect(landed.isError, text(landed)).toBeFalsy();
    expect(landed.structuredContent).toMatchObject({ into: "main", alreadyLanded: false });
    expect(readFileSync(join(repo, "LANDED.md"), "utf8")).toBe("from a branch\n");
    expect((await git("log", "--format=%s", "main")).stdout).toContain("first");
  }, 60_000);
  it("a result taken for a results call the client cancelled is given by the next call", async () => {
    const cancelled = new AbortController();
    const waiting = first.client
      .callTool({ name: "results", arguments: { wait_seconds: 30 } }, undefined, { signal: cancelled.signal })
      .catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 300));
    cancelled.abort("the client gave up");
    expect(await waiting).toBeInstanceOf(Error);
    // the daemon's take is still waiting for the MCP server: this child's answer lands in it
    const started = await call(first, "delegate", { task: "answer a cancelled wait", background: true });
    const child = started.structuredContent?.childSessionId as string;
    await settled(first, child);
    await new Promise((r) => setTimeout(r, 1_000));
    expect(resultChildren(await call(first, "results", { wait_seconds: 30 }))).toEqual([child]);
    expect((await call(first, "results")).structuredContent?.results).toEqual([]);
  }, 60_000);
  it("a results wait of an MCP server that died takes nothing: the next server gets the answer", async () => {
    const pending = call(first, "results", { wait_seconds: 60 }).catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 300));
    process.kill(first.transport.pid as number, "SIGKILL");
    await pending;
    await first.client.close().catch(() => {});
    first = await serve();
    const started = await call(first, "delegate", { task: "answer after a dead wait", background: true });
    const child = started.structuredContent?.childSessionId as string;
    await settled(first, child);
    // the dead server's wait in the daemon re-checks every 500 ms: give it the chance to take wrongly
    await new Promise((r) => setTimeout(r, 1_500));
    expect(resultChildren(await call(first, "results"))).toEqual([child]);
  }, 60_000);
  it("with no daemon and none to start, tools say why, and the server exits as soon as its client leaves", async () => {
    const empty = join(root, "no-daemon");
    const lonely = await serveMcp({
      dataDir: empty,
      session: "alone",
      cwd: work,
      env: env(),
      args: ["--no-start"],
    });
    const { tools } = await lonely.client.listTools();
    expect(tools).toHaveLength(9);
    const r = await call(lonely, "status");
    expect(r.isError).toBe(true);
    expect(text(r)).toContain(`no daemon runs on ${empty}`);
    const pid = lonely.transport.pid as number;
    const t0 = Date.now();
    await lonely.client.close();
    while (alive(pid) && Date.now() - t0 < 10_000) await new Promise((r) => setTimeout(r, 50));
    expect(alive(pid)).toBe(false);
    expect(Date.now() - t0).toBeLessThan(3_000);
  }, 90_000);
});
