import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PgDelegationRepository } from "@crw/db";
import { type ModelReply, type ModelRequest, type ModelServer, startModelServer } from "@crw/tools/models";
import { useTestDatabase } from "@crw/tools/pg";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/index.js";
import { TestClient } from "./support/client.js";
import { startTestDaemon } from "./support/daemon.js";

/**
 * Sessions that do work: a real daemon with forked runners, a real PostgreSQL, real git repositories and a
 * model server on 127.0.0.1 speaking the OpenAI Chat Completions and Anthropic Messages streaming
 * protocols. The model reads a file, edits it, runs the repository's test and reports; the assertions read
 * the files on disk.
 */
const db = useTestDatabase();
const KEY = "CRW_TEST_WORKDIR_KEY";
const MODELS = { completions: "openai-completions:loopback-a", messages: "anthropic-messages:loopback-b" };
let models: ModelServer;
let daemon: Daemon;
let dataHolder: string;
let owner: TestClient;
const made: string[] = [];
const placed: { sessionId: string; placement: string }[] = [];

/** Starts a workflow (JSON definition) working in `cwd` and follows it to its end. */
async function runWorkflow(definition: string, cwd: string, extra: object = {}) {
  const started = await owner.ok<{ workflowId: string; cwd: string }>("workflow.start", {
    definition,
    format: "json",
    cwd,
    ...extra,
  });
  const done = await owner.ok<{ status: string; summary: string }>("workflow.follow", {
    workflowId: started.workflowId,
  });
  return { started, done };
}

const git = (cwd: string, ...args: string[]) => execFileSync("git", args, { cwd, encoding: "utf8" }).trim();

/** A repository with a broken `add` and a test that says whether it is fixed. */
function sampleRepo(): string {
  const dir = mkdtempSync(join(tmpdir(), "crw-workdir-repo-"));
  made.push(dir);
  const git = (...args: string[]) => execFileSync("git", args, { cwd: dir, stdio: "ignore" });
  git("init", "-q", "-b", "main");
  writeFileSync(join(dir, "calc.js"), "export const add = (a, b) => a - b;\n");
  writeFileSync(
    join(dir, "test.js"),
    'import { add } from "./calc.js";\nif (add(2, 3) !== 5) { console.log("FAIL"); process.exit(1); }\nconsole.log("PASS");\n',
  );
  writeFileSync(join(dir, "package.json"), '{ "type": "module" }\n');
  git("add", ".");
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "sample");
  return dir;
}

/** The model's side of "fix add and prove it": read, edit, test, report — one step per tool result. */
function fixer(request: ModelRequest): ModelReply {
  const step = request.toolResults.length;
  if (step === 0) return { tool: { name: "read", arguments: { path: "calc.js" } } };
  // The ALT variant fixes the same line another way: two such children conflict.
  const newText = request.userTexts.some((t) => t.includes("ALT")) ? "b + a" : "a + b";
  if (step === 1)
    return { tool: { name: "edit", arguments: { path: "calc.js", oldText: "a - b", newText } } };
  if (step === 2) return { tool: { name: "shell", arguments: { command: "node test.js" } } };
  return { text: `fixed; the test says ${request.toolResults[2]?.text.includes("PASS") ? "PASS" : "FAIL"}` };
}

/** A result longer than a handover holds: its dependent sees the head only, unless it reads the whole. */
const LONG_PLAN = `${Array.from({ length: 60 }, (_, i) => `step ${i}: change module ${i} and test it`).join("\n")}\nEND OF PLAN`;
/** The path of the plan's full result, as its direct dependent's prompt names it. */
let planResultPath: string | undefined;

/**
 * A node that reads a full result with WorkflowRead: the one its prompt names, or (READ-PLAN-TOO) the plan's,
 * which only its direct dependent was granted.
 */
function reader(request: ModelRequest, task: string): ModelReply {
  const named = /\(full result: (workflow-artifacts\/\S+)\)/.exec(task)?.[1];
  const path = task.includes("READ-PLAN-TOO") ? planResultPath : named;
  if (task.includes("READ-FULL")) planResultPath ??= named;
  if (request.toolResults.length === 0) return { tool: { name: "WorkflowRead", arguments: { path } } };
  return { text: `read: ${request.toolResults[0]?.text.slice(-40)}` };
}

/** Routes a request to a scenario by the marker of the task it works on. */
function answer(request: ModelRequest): ModelReply {
  const task = request.userTexts.join("\n");
  if (task.includes("FIX-ADD")) return fixer(request);
  const startDefinition = /START-DEF (\S+)/.exec(task);
  if (startDefinition) {
    if (request.toolResults.length === 0)
      return { tool: { name: "WorkflowStart", arguments: { path: startDefinition[1], foreground: true } } };
    return { text: `WorkflowStart said: ${request.toolResults[0]?.text}` };
  }
  if (task.includes("LONG-PLAN")) return { text: LONG_PLAN };
  if (task.includes("READ-FULL") || task.includes("READ-PLAN-TOO")) return reader(request, task);
  // the workflow's parent, given its summary: it reads the plan's full result the summary names
  if (task.includes('Workflow "plan-build-review"')) {
    const path = /- plan: succeeded\n[\s\S]*?\(full result: (workflow-artifacts\/\S+)\)/.exec(task)?.[1];
    if (request.toolResults.length === 0) return { tool: { name: "WorkflowRead", arguments: { path } } };
    return { text: "the parent read the plan" };
  }
  // A node that grows its workflow by one node, placed at the given cwd, which writes ADDED.md there.
  const addNode = /ADD-NODE-AT (\S+)/.exec(task);
  if (addNode) {
    if (request.toolResults.length === 0) {
      const node = {
        id: "added",
        task: "WRITE-FILE ADDED.md as added",
        cwd: addNode[1],
        model: MODELS.completions,
      };
      return { tool: { name: "WorkflowAddNodes", arguments: { nodes: [node] } } };
    }
    return { text: `added: ${request.toolResults[0]?.text}` };
  }
  const escapeTo = /ESCAPE-TO (\S+)/.exec(task);
  if (escapeTo) {
    if (request.toolResults.length === 0)
      return { tool: { name: "Delegate", arguments: { task: "write here", cwd: escapeTo[1] } } };
    return { text: `delegate said: ${request.toolResults[0]?.text}` };
  }
  if (task.includes("WRITE-NOTE")) {
    if (request.toolResults.length === 0)
      return { tool: { name: "write", arguments: { path: "NOTE.md", content: "written by a child\n" } } };
    return { text: `write said: ${request.toolResults[0]?.text}` };
  }
  const write = /WRITE-FILE (\S+)(?: as (\S+))?/.exec(task);
  if (write) {
    const content = `${write[1]} by ${write[2] ?? "its node"}\n`;
    if (request.toolResults.length === 0)
      return { tool: { name: "write", arguments: { path: write[1], content } } };
    return { text: `wrote ${write[1]}` };
  }
  if (task.includes("JOIN-READ")) {
    if (request.toolResults.length === 0)
      return { tool: { name: "shell", arguments: { command: "cat A.md B.md" } } };
    return { text: `the join saw: ${request.toolResults[0]?.text.replace(/\s+/g, " ")}` };
  }
  return { text: "nothing to do" };
}

beforeAll(async () => {
  models = await startModelServer(answer);
  // The data directory inside a directory of its own, which a test tries as a working directory.
  dataHolder = mkdtempSync(join(tmpdir(), "crw-daemon-workdir-"));
  const dataDir = join(dataHolder, "data");
  mkdirSync(dataDir);
  made.push(dataHolder);
  ({ daemon, owner } = await startTestDaemon({
    databaseUrl: db.url,
    dataDir,
    baseUrls: { "openai-completions": models.openaiBaseUrl, "anthropic-messages": models.anthropicBaseUrl },
    keyVar: KEY,
    overrides: { runtime: { maxRunners: 2, turnsPerRunner: 4 } },
    start: { observeTurn: (request, placement) => placed.push({ sessionId: request.sessionId, placement }) },
  }));
});

afterAll(async () => {
  owner?.close();
  await daemon?.stop();
  await models?.close();
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

/** A second account with a token of its own: neither the owner nor an administrator. */
async function stranger(): Promise<TestClient> {
  const pool = new pg.Pool({ connectionString: db.url, max: 1 });
  try {
    const repo = new PgDelegationRepository(pool);
    const account = await repo.createAccount({ name: `guest-${randomBytes(4).toString("hex")}` });
    const token = randomBytes(24).toString("base64url");
    await repo.addApiToken(account.id, createHash("sha256").update(token).digest());
    return await TestClient.connect(daemon.state.url, token);
  } finally {
    await pool.end();
  }
}

describe("sessions with a working directory do real work", () => {
  for (const model of Object.values(MODELS)) {
    const protocol = model.split(":")[0];
    it(`a root session with a cwd reads a file, edits it, runs the test and reports (${protocol})`, async () => {
      const repo = sampleRepo();
      const { sessionId, cwd } = await owner.ok<{ sessionId: string; cwd: string }>("session.create", {
        model,
        cwd: repo,
      });
      expect(cwd).toBe(repo);
      const from = models.requests.length;
      const r = await owner.ok<{ stopReason: string; reply: string }>("session.send", {
        sessionId,
        text: "FIX-ADD in calc.js",
      });
      expect(r.reply).toBe("fixed; the test says PASS");
      expect(readFileSync(join(repo, "calc.js"), "utf8")).toBe("export const add = (a, b) => a + b;\n");
      const seen = models.requests.slice(from);
      expect(seen).toHaveLength(4);
      expect(seen.every((q) => q.protocol === protocol)).toBe(true);
      expect(seen[0]?.tools).toEqual(expect.arrayContaining(["read", "write", "edit", "shell"]));
      expect(seen[1]?.toolResults[0]?.text).toContain("a - b");
      // A root session's turns, its working directory and tools included, run in the daemon.
      expect(placed.filter((p) => p.sessionId === sessionId).map((p) => p.placement)).toEqual(["in-process"]);
    });
  }

  it("a delegated child with no cwd of its own inherits its parent's and works there, in a runner", async () => {
    const repo = sampleRepo();
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODELS.completions,
      cwd: repo,
    });
    const receipt = await owner.ok<{ kind: string; childSessionId: string; body: string }>(
      "session.delegate",
      {
        sessionId,
        task: "FIX-ADD please",
        model: MODELS.messages,
      },
    );
    expect(receipt.body).toContain("fixed; the test says PASS");
    expect(readFileSync(join(repo, "calc.js"), "utf8")).toContain("a + b");
    const child = await owner.ok<{ session: { cwd: string } }>("session.read", {
      sessionId: receipt.childSessionId,
    });
    expect(child.session.cwd).toBe(repo);
    expect(daemon.runtime.executionFor(receipt.childSessionId)).toMatchObject({ location: "runner" });
  });

  it("a session without a cwd gets no coding tools", async () => {
    const { sessionId, cwd } = await owner.ok<{ sessionId: string; cwd: string | null }>("session.create", {
      model: MODELS.completions,
    });
    expect(cwd).toBeNull();
    await owner.ok("session.send", { sessionId, text: "NO-CWD-PROBE" });
    const last = models.requests.findLast((q) => q.userTexts.includes("NO-CWD-PROBE"));
    expect(last).toBeDefined();
    expect(last?.tools).not.toContain("shell");
    expect(last?.tools).not.toContain("read");
  });
});

describe("workflows work in a directory too", () => {
  it("two parallel nodes write different files and the node that joins them sees both", async () => {
    const repo = sampleRepo();
    const definition = JSON.stringify({
      name: "two-writers",
      nodes: [
        { id: "a", task: "WRITE-FILE A.md", model: MODELS.completions },
        { id: "b", task: "WRITE-FILE B.md", model: MODELS.messages },
        { id: "join", task: "JOIN-READ both files", dependsOn: ["a", "b"], model: MODELS.completions },
      ],
    });
    const { started, done } = await runWorkflow(definition, repo, { model: MODELS.completions });
    expect(started.cwd).toBe(repo);
    expect(done.status).toBe("completed");
    expect(readFileSync(join(repo, "A.md"), "utf8")).toBe("A.md by its node\n");
    expect(readFileSync(join(repo, "B.md"), "utf8")).toBe("B.md by its node\n");
    expect(done.summary).toContain("the join saw: exit code 0 A.md by its node B.md by its node");
  });

  it("a node whose cwd leaves the workflow's project fails before it runs, and writes nothing", async () => {
    const repo = sampleRepo();
    const outside = mkdtempSync(join(tmpdir(), "crw-workdir-node-outside-"));
    made.push(outside);
    const definition = JSON.stringify({
      name: "escape",
      nodes: [{ id: "out", task: "WRITE-FILE A.md", cwd: outside, model: MODELS.completions }],
    });
    const { done } = await runWorkflow(definition, repo);
    expect(done.status).not.toBe("completed");
    expect(done.summary).toMatch(/outside the parent's project/);
    expect(existsSync(join(outside, "A.md"))).toBe(false);
  });
});

describe("an agent starts a workflow from a definition in its own project", () => {
  it("a session's WorkflowStart reads the definition from its own project, relative to its directory, and one without a directory reads nothing (S004-287)", async () => {
    const repo = sampleRepo();
    mkdirSync(join(repo, "sub"));
    const definition = {
      name: "from-the-project",
      nodes: [{ id: "note", task: "WRITE-FILE FROM-DEF.md as def-node", model: MODELS.completions }],
    };
    writeFileSync(join(repo, "review.json"), JSON.stringify(definition));
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODELS.completions,
      cwd: join(repo, "sub"),
    });
    // the path is the session's: relative to its directory, inside the repository that holds it
    const r = await owner.ok<{ reply: string }>("session.send", {
      sessionId,
      text: "START-DEF ../review.json",
    });
    expect(r.reply).toContain('Workflow "from-the-project"');
    expect(r.reply).toContain("note: succeeded");
    expect(readFileSync(join(repo, "sub", "FROM-DEF.md"), "utf8")).toBe("FROM-DEF.md by def-node\n");

    // a session with no directory on this host has no project to read from: nothing is read, nothing starts
    const bare = await owner.ok<{ sessionId: string }>("session.create", { model: MODELS.completions });
    const refused = await owner.ok<{ reply: string }>("session.send", {
      sessionId: bare.sessionId,
      text: "START-DEF review.json",
    });
    expect(refused.reply).toContain("this session has no project directory to read it from");
    const nodeTurns = models.requests.filter(
      (q) => q.toolResults.length === 0 && q.userTexts.some((t) => t.includes("WRITE-FILE FROM-DEF.md")),
    );
    expect(nodeTurns).toHaveLength(1);
  });
});

describe("Delegate and a workflow node place a working directory the same way", () => {
  it("a relative or absolute directory through a symlink lands Delegate, a started node and an added node at its real path, and every escape is refused by all three with the same reason (S004-254)", async () => {
    const repo = sampleRepo();
    const outside = mkdtempSync(join(tmpdir(), "crw-workdir-both-outside-"));
    made.push(outside);
    mkdirSync(join(repo, "sub"));
    symlinkSync(join(repo, "sub"), join(repo, "link-in"));
    symlinkSync(outside, join(repo, "link-out"));
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODELS.completions,
      cwd: repo,
    });
    const delegated = await owner.ok<{ body: string }>("session.delegate", {
      sessionId,
      task: "WRITE-FILE D.md as delegate",
      cwd: "link-in",
    });
    expect(delegated.body).toContain("wrote D.md");
    const absolute = await owner.ok<{ body: string }>("session.delegate", {
      sessionId,
      task: "WRITE-FILE DA.md as delegate",
      cwd: join(repo, "link-in"),
    });
    expect(absolute.body).toContain("wrote DA.md");
    const node = await runWorkflow(
      JSON.stringify({
        name: "placed",
        nodes: [
          { id: "n", task: "WRITE-FILE N.md as node", cwd: "link-in", model: MODELS.completions },
          {
            id: "na",
            task: "WRITE-FILE NA.md as node",
            cwd: join(repo, "link-in"),
            model: MODELS.completions,
          },
          { id: "grow", task: "ADD-NODE-AT link-in", model: MODELS.completions },
        ],
      }),
      repo,
      { model: MODELS.completions },
    );
    expect(node.done.status, node.done.summary).toBe("completed");
    // Every child worked in the real directory behind the link.
    for (const [file, by] of [
      ["D.md", "delegate"],
      ["DA.md", "delegate"],
      ["N.md", "node"],
      ["NA.md", "node"],
      ["ADDED.md", "added"],
    ])
      expect(readFileSync(join(repo, "sub", file as string), "utf8")).toBe(`${file} by ${by}\n`);
    const cwds = await db.pool.query<{ work_dir: string }>(
      `select scope::jsonb ->> 'workDir' as work_dir from sessions
        where kind = 'delegated' and scope is not null and scope::jsonb ->> 'workDir' like $1`,
      [`${repo}/%`],
    );
    expect(new Set(cwds.rows.map((r) => r.work_dir))).toEqual(new Set([join(repo, "sub")]));
    for (const cwd of ["..", "link-out", outside]) {
      const refused = await owner.call("session.delegate", { sessionId, task: "WRITE-NOTE", cwd });
      const error = refused.error as { message: string; data: { code: string } };
      expect(error.data.code).toBe("work_dir_outside_project");
      const escaped = await runWorkflow(
        JSON.stringify({
          name: "escape",
          nodes: [{ id: "out", task: "WRITE-NOTE", cwd, model: MODELS.completions }],
        }),
        repo,
      );
      expect(escaped.done.status, cwd).not.toBe("completed");
      expect(escaped.done.summary, cwd).toContain(error.message);
      const added = await runWorkflow(
        JSON.stringify({
          name: "escape-added",
          nodes: [{ id: "grow", task: `ADD-NODE-AT ${cwd}`, model: MODELS.completions }],
        }),
        repo,
        { model: MODELS.completions },
      );
      expect(added.done.status, cwd).not.toBe("completed");
      expect(added.done.summary, cwd).toContain(error.message);
    }
    expect(existsSync(join(outside, "ADDED.md"))).toBe(false);
    expect(existsSync(join(outside, "NOTE.md"))).toBe(false);
  });
});

describe("isolated workflow nodes work on branches of their own, and the workflow lands", () => {
  const isolatedFlow = (name: string, a: string, b: string) =>
    JSON.stringify({
      name,
      nodes: [
        { id: "a", task: a, isolation: "worktree", model: MODELS.completions },
        { id: "b", task: b, isolation: "worktree", model: MODELS.messages },
        {
          id: "join",
          task: "JOIN-READ both files",
          dependsOn: ["a", "b"],
          isolation: "worktree",
          model: MODELS.completions,
        },
      ],
    });

  it("parallel isolated nodes commit on their branches, the join starts from their merge, landing brings all home", async () => {
    const repo = sampleRepo();
    const definition = isolatedFlow("isolated-writers", "WRITE-FILE A.md", "WRITE-FILE B.md");
    const { started, done } = await runWorkflow(definition, repo);
    expect(done.status, done.summary).toBe("completed");
    // The join ran in a worktree made from the merge of a's and b's branches: it saw both files.
    expect(done.summary).toContain("the join saw: exit code 0 A.md by its node B.md by its node");
    expect(done.summary).toMatch(/committed on branch crw\/[0-9a-f]{8} at [0-9a-f]{12}/);
    // The join only read: it says so, and names no commit of its own.
    expect(done.summary).toMatch(/isolated on branch crw\/[0-9a-f]{8}: no changes/);
    // Nothing reached the user's checkout before landing.
    expect(existsSync(join(repo, "A.md"))).toBe(false);
    const landed = await owner.ok<{ landed: { nodeId: string; into: string }[] }>("workflow.land", {
      workflowId: started.workflowId,
    });
    expect(landed.landed.map((l) => l.nodeId)).toEqual(expect.arrayContaining(["a", "b", "join"]));
    expect(readFileSync(join(repo, "A.md"), "utf8")).toBe("A.md by its node\n");
    expect(readFileSync(join(repo, "B.md"), "utf8")).toBe("B.md by its node\n");
    expect(git(repo, "status", "--porcelain")).toBe("");
  });

  it("a join whose dependencies' branches conflict fails naming the paths, before it runs", async () => {
    const repo = sampleRepo();
    const definition = isolatedFlow("isolated-conflict", "WRITE-FILE C.md as one", "WRITE-FILE C.md as two");
    const { done } = await runWorkflow(definition, repo);
    expect(done.status).not.toBe("completed");
    expect(done.summary).toMatch(/join: failed[\s\S]*conflicts in C\.md/);
    expect(existsSync(join(repo, "C.md"))).toBe(false);
  });
});

describe("a node reads the full result of a node it depends on", () => {
  it("its direct dependent reads the whole of a result its handover cut short, as the workflow's parent does from its summary; a node further down is refused it (S004-305)", async () => {
    const definition = JSON.stringify({
      name: "plan-build-review",
      nodes: [
        { id: "plan", task: "LONG-PLAN for the change", model: MODELS.completions },
        { id: "build", task: "READ-FULL plan, then build", dependsOn: ["plan"], model: MODELS.messages },
        { id: "review", task: "READ-PLAN-TOO", dependsOn: ["build"], model: MODELS.completions },
      ],
    });
    const from = models.requests.length;
    const repo = sampleRepo();
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODELS.completions,
      cwd: repo,
    });
    const { done } = await runWorkflow(definition, repo, { sessionId });
    expect(done.status, done.summary).toBe("completed");
    const seen = models.requests.slice(from);
    const build = seen.filter((q) => q.userTexts.some((t) => t.includes("READ-FULL")));
    // the handover in its prompt is the plan's head only; what WorkflowRead gave it is the whole
    expect(build[0]?.userTexts.join("\n")).not.toContain("END OF PLAN");
    expect(build[0]?.tools).toContain("WorkflowRead");
    expect(build.at(-1)?.toolResults[0]?.text).toBe(LONG_PLAN);
    // review depends on build only: the plan's path is refused to it, and reads nothing
    const review = seen.filter((q) => q.userTexts.some((t) => t.includes("READ-PLAN-TOO")));
    expect(review.at(-1)?.toolResults[0]?.text).toContain("WorkflowRead reaches only the full results");
    expect(review.at(-1)?.toolResults[0]?.text).not.toContain("END OF PLAN");
    // a node with no stored dependency result is offered no WorkflowRead
    const plan = seen.filter((q) => q.userTexts.some((t) => t.includes("LONG-PLAN")));
    expect(plan[0]?.tools).not.toContain("WorkflowRead");
    // the parent's summary names the plan's full result after its cut head; the parent reads the whole
    expect(done.summary).toMatch(
      /- plan: succeeded\n[\s\S]*…\s\(full result: workflow-artifacts\/\S+\/plan\/[0-9a-f]{64}\)/,
    );
    const deadline = Date.now() + 20_000;
    const parentRead = () =>
      models.requests
        .slice(from)
        .find(
          (q) =>
            q.userTexts.some((t) => t.includes('Workflow "plan-build-review"')) && q.toolResults.length > 0,
        );
    while (!parentRead() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    expect(parentRead()?.toolResults[0]?.text).toBe(LONG_PLAN);
  });
});

describe("isolated children work in a worktree of their own, and their work lands", () => {
  it("an isolated child in a runner fixes the code on its own branch; crw commits it; landing brings it home", async () => {
    const repo = sampleRepo();
    const head = git(repo, "rev-parse", "HEAD");
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODELS.completions,
      cwd: repo,
    });
    const r = await owner.ok<{ childSessionId: string; body: string }>("session.delegate", {
      sessionId,
      task: "FIX-ADD on your own branch",
      model: MODELS.messages,
      isolation: "worktree",
    });
    expect(r.body).toContain("fixed; the test says PASS");
    const branch = /committed on branch (crw\/[0-9a-f]{12}) at ([0-9a-f]{12})/.exec(r.body);
    expect(branch, r.body).not.toBeNull();
    // The parent's checkout is untouched; the branch holds one commit by crw with the fix.
    expect(readFileSync(join(repo, "calc.js"), "utf8")).toContain("a - b");
    expect(git(repo, "rev-parse", "HEAD")).toBe(head);
    expect(git(repo, "log", "--format=%an %s", `${head}..${branch?.[1]}`)).toMatch(/^crw crw: work of child/);
    expect(git(repo, "show", `${branch?.[1]}:calc.js`)).toContain("a + b");
    expect(daemon.runtime.executionFor(r.childSessionId)).toMatchObject({ location: "runner" });
    const child = await owner.ok<{ session: { cwd: string } }>("session.read", {
      sessionId: r.childSessionId,
    });
    expect(child.session.cwd).not.toBe(repo);
    const landed = await owner.ok<{ into: string; fastForward: boolean; changedPaths: string[] }>(
      "session.land",
      {
        sessionId: r.childSessionId,
      },
    );
    expect(landed).toMatchObject({ into: "main", fastForward: true, changedPaths: ["calc.js"] });
    expect(readFileSync(join(repo, "calc.js"), "utf8")).toContain("a + b");
    expect(git(repo, "status", "--porcelain")).toBe("");
  });

  it("an isolated child refused after its worktree was made (its directory is not in HEAD) leaves no worktree", async () => {
    const repo = sampleRepo();
    mkdirSync(join(repo, "untracked"));
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODELS.completions,
      cwd: join(repo, "untracked"),
    });
    const r = await owner.call("session.delegate", { sessionId, task: "FIX-ADD", isolation: "worktree" });
    expect(r.error).toMatchObject({ data: { code: "work_dir_unavailable" } });
    expect(git(repo, "worktree", "list", "--porcelain").match(/^worktree /gm)).toHaveLength(1);
  });

  it("a land that conflicts refuses, names the paths, and leaves the branch it would land into as it was", async () => {
    const repo = sampleRepo();
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODELS.completions,
      cwd: repo,
    });
    const one = await owner.ok<{ childSessionId: string }>("session.delegate", {
      sessionId,
      task: "FIX-ADD one",
      isolation: "worktree",
    });
    const two = await owner.ok<{ childSessionId: string }>("session.delegate", {
      sessionId,
      task: "FIX-ADD ALT two",
      isolation: "worktree",
    });
    await owner.ok("session.land", { sessionId: one.childSessionId });
    const before = git(repo, "rev-parse", "main");
    const refused = await owner.call("session.land", { sessionId: two.childSessionId });
    expect(refused.error).toMatchObject({ data: { code: "merge_conflict" } });
    expect(JSON.stringify(refused.error)).toContain("calc.js");
    expect(git(repo, "rev-parse", "main")).toBe(before);
    expect(git(repo, "status", "--porcelain")).toBe("");
    expect(readFileSync(join(repo, "calc.js"), "utf8")).toContain("a + b");
  });
});

describe("working directories are refused where they do not belong", () => {
  it("another account may not work outside the projects granted to it; a granted one it may", async () => {
    const guest = await stranger();
    try {
      const repo = sampleRepo();
      const refused = await guest.call("session.create", { model: MODELS.completions, cwd: repo });
      expect(refused.error).toMatchObject({ data: { code: "work_dir_not_permitted" } });
      const { name } = await owner.ok<{ name: string }>("project.add", {
        path: repo,
        name: `p-${randomBytes(3).toString("hex")}`,
      });
      const whoami = await guest.ok<{ accountId: string }>("daemon.whoami");
      await owner.ok("project.add", { path: repo, name, account: whoami.accountId });
      const inside = join(repo, "sub");
      mkdirSync(inside);
      const placed = await guest.ok<{ cwd: string }>("session.create", {
        model: MODELS.completions,
        cwd: inside,
      });
      expect(placed.cwd).toBe(inside);
      // Managing projects is for operators.
      expect((await guest.call("project.list", {})).error).toMatchObject({ data: { code: "not_permitted" } });
    } finally {
      guest.close();
    }
  });

  it("a child escaping its parent's project (.., a symlink, an absolute path) is refused and writes nothing", async () => {
    const repo = sampleRepo();
    const outside = mkdtempSync(join(tmpdir(), "crw-workdir-outside-"));
    made.push(outside);
    symlinkSync(outside, join(repo, "link-out"));
    for (const cwd of ["..", "link-out", outside]) {
      const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
        model: MODELS.completions,
        cwd: repo,
      });
      const r = await owner.ok<{ reply: string }>("session.send", { sessionId, text: `ESCAPE-TO ${cwd}` });
      expect(r.reply).toMatch(/work_dir_outside_project|outside the parent's project/);
      const direct = await owner.call("session.delegate", { sessionId, task: "WRITE-NOTE", cwd });
      expect(direct.error).toMatchObject({ data: { code: "work_dir_outside_project" } });
    }
    expect(existsSync(join(outside, "NOTE.md"))).toBe(false);
  });

  it("a directory holding the daemon's own data (tokens, password) is nobody's working directory, nor a project", async () => {
    for (const cwd of [dataHolder, join(dataHolder, "data"), join(dataHolder, "data", "spill")]) {
      mkdirSync(cwd, { recursive: true });
      const r = await owner.call("session.create", { model: MODELS.completions, cwd });
      expect(r.error, cwd).toMatchObject({ data: { code: "work_dir_not_permitted" } });
    }
    const project = await owner.call("project.add", { path: dataHolder, name: "holder" });
    expect(project.error).toMatchObject({ data: { code: "work_dir_not_permitted" } });
    const repo = sampleRepo();
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODELS.completions,
    });
    const child = await owner.call("session.delegate", { sessionId, task: "WRITE-NOTE", cwd: dataHolder });
    expect(child.error).toMatchObject({ data: { code: "work_dir_not_permitted" } });
    expect(existsSync(join(repo, "NOTE.md"))).toBe(false);
  });

  it("a read-only child's write is refused and nothing is written", async () => {
    const repo = sampleRepo();
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODELS.completions,
      cwd: repo,
    });
    const r = await owner.ok<{ body: string }>("session.delegate", {
      sessionId,
      task: "WRITE-NOTE",
      readOnly: true,
    });
    expect(r.body).toMatch(/write said: .*(read-only|not found|no tool)/i);
    expect(existsSync(join(repo, "NOTE.md"))).toBe(false);
  });

  it("a working directory that vanished is refused on the next turn with a typed error", async () => {
    const repo = sampleRepo();
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create", {
      model: MODELS.completions,
      cwd: repo,
    });
    rmSync(repo, { recursive: true, force: true });
    const r = await owner.call("session.send", { sessionId, text: "FIX-ADD" });
    expect(r.error).toMatchObject({ data: { code: "work_dir_unavailable" } });
  });
});
