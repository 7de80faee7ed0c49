import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import { type NodeDispatcher, parseWorkflowDefinition } from "../src/index.js";
import {
  closeEnginesAfterEach,
  deferred,
  oneNodeDefinition,
  taskLine,
  until,
  untilAborted,
  workflowJournal,
  world,
} from "./helpers.js";

/**
 * A run's own state on a real database: how it is let go of (said once, and only when it is stale), an
 * answer that comes after it was let go of, what its snapshot says of a failed node, and an isolated
 * node's work committed (or not) when the node settles.
 */
const db = useTestDatabase();
const all = closeEnginesAfterEach();

describe("a run let go of", () => {
  it("as stale says so once, however often it is let go of", async () => {
    const w = await world(db.pool);
    const { engine, events } = await w.engine(({ signal }) => untilAborted(signal));
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNodeDefinition });
    const run = engine.run(started.workflowId);
    run?.abandon("stale");
    run?.abandon("stale");
    expect(events.filter((e) => e.type === "stale")).toEqual([
      { type: "stale", workflowId: started.workflowId, generation: 1 },
    ]);
    expect((await engine.finished(started.workflowId)).status).toBeNull();
  });

  it("as the process closes says nothing of staleness", async () => {
    const w = await world(db.pool);
    const { engine, events } = await w.engine(({ signal }) => untilAborted(signal));
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNodeDefinition });
    const run = engine.run(started.workflowId);
    await until(() => run?.started.has("a") === true, "a running");
    run?.abandon("closing");
    expect(run?.stopped).toBe(true);
    expect((await engine.finished(started.workflowId)).status).toBeNull();
    expect(events.filter((e) => e.type === "stale")).toEqual([]);
  });

  it("takes no answer that comes after: the node stays running, no outcome is told or published", async () => {
    const w = await world(db.pool);
    const answered = deferred();
    const { engine, events } = await w.engine(() => "unused", {
      wrap: (base): NodeDispatcher => ({
        createChild: (r) => base.createChild(r),
        // the child answers although its turn was aborted: the answer arrives after the run was let go of
        runNode: async (r) => {
          await untilAborted(r.signal).catch(() => undefined);
          answered.resolve();
          return { status: "answered", reply: "late" };
        },
        continueNode: (r, host) => base.continueNode(r, host),
      }),
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNodeDefinition });
    const run = engine.run(started.workflowId);
    await until(() => run?.started.has("a") === true, "a running");
    const published = async () =>
      (await db.pool.query("select published_count from workflows where id = $1::uuid", [started.workflowId]))
        .rows[0].published_count;
    const before = await published();
    run?.abandon("closing");
    await answered.promise;
    await new Promise((r) => setTimeout(r, 100));
    expect(run?.journal.nodes.a?.status).toBe("running");
    expect(
      events.filter((e) => e.type === "node" && e.nodeId === "a").map((e) => e.type === "node" && e.status),
    ).toEqual(["reserved", "running"]);
    expect(await published()).toBe(before);
  });
});

describe("a run's journal writes", () => {
  it("one queued behind a write in flight is not made once the run is let go of, and its caller is told", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(({ signal }) => untilAborted(signal));
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNodeDefinition });
    const run = engine.run(started.workflowId);
    await until(() => run?.started.has("a") === true, "a running");
    // From here, each journal write is counted, and the first is held until the test lets it go.
    const store = engine.store;
    const write = store.writeJournalText.bind(store);
    const reached = deferred();
    const release = deferred();
    let writes = 0;
    store.writeJournalText = async (...args) => {
      writes++;
      if (writes === 1) {
        reached.resolve();
        await release.promise;
      }
      return write(...args);
    };
    const add = (id: string) =>
      engine.addNodes({
        workflowId: started.workflowId,
        principalAccountId: w.accountId,
        nodes: [{ id, task: `TASK ${id}`, dependsOn: ["a"] }],
      });
    const first = add("b");
    await reached.promise;
    const second = add("c").catch((e: unknown) => e);
    run?.abandon("closing");
    release.resolve();
    await expect(first).resolves.toEqual(["b"]);
    expect(await second).toMatchObject({ code: "lease_lost" });
    expect(writes).toBe(1);
  });

  it("a summary handoff that throws after the run was let go of is not reported as the run lost", async () => {
    const w = await world(db.pool);
    const { engine, events } = await w.engine(() => "done");
    all.push(engine);
    const reached = deferred();
    const fail = deferred();
    engine.store.deliverSummary = async () => {
      reached.resolve();
      await fail.promise;
      throw new Error("connection lost");
    };
    const started = await engine.start(w.ctx(), { definition: oneNodeDefinition });
    await reached.promise;
    engine.run(started.workflowId)?.abandon("closing");
    fail.resolve();
    expect((await engine.finished(started.workflowId)).status).toBeNull();
    await new Promise((r) => setTimeout(r, 50));
    expect(events.filter((e) => e.type === "run_lost")).toEqual([]);
  });
});

describe("a run's snapshot", () => {
  it("says why a node failed", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(() => {
      throw new Error("provider down");
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: oneNodeDefinition });
    expect((await engine.finished(started.workflowId)).status).toBe("failed");
    const { rows } = await db.pool.query("select snapshot from workflows where id = $1::uuid", [
      started.workflowId,
    ]);
    const [node] = rows[0].snapshot.nodes;
    expect(node).toMatchObject({ id: "a", status: "failed" });
    expect(node.error).toContain("provider down");
  });
});

/** A git repository with one commit on main, and a session placed in it. */
function repository() {
  const repo = scratchDir("crw-state-repo-");
  const git = (...args: string[]) =>
    execFileSync("git", ["-c", "user.email=t@example.com", "-c", "user.name=t", ...args], {
      cwd: repo,
      encoding: "utf8",
    }).trim();
  git("init", "-q", "-b", "main");
  writeFileSync(join(repo, "README.md"), "hello\n");
  git("add", ".");
  git("commit", "-q", "-m", "init");
  return {
    repo,
    git,
    options: {
      workDirPolicy: async () => ({ kind: "scoped" as const, project: { ref: "proj", root: repo } }),
      worktreesDir: scratchDir("crw-state-worktrees-"),
    },
    ctx: {
      access: { target: { kind: "host" as const, ref: "proj" }, projectRef: "proj" },
      currentWorkDir: async () => repo,
    },
  };
}

const isolatedNode = parseWorkflowDefinition(
  'name: isolated\nnodes:\n  - { id: a, task: "TASK a", isolation: worktree }\n',
);

/** The worktree an isolated child works in, read from its row. */
async function worktreeOf(sessionId: string): Promise<string> {
  const { rows } = await db.pool.query("select path from isolated_worktrees where session_id = $1::uuid", [
    sessionId,
  ]);
  return rows[0].path;
}

describe("an isolated node's work", () => {
  it("is committed on its branch when the node settles, and its outcome says where", async () => {
    const r = repository();
    const w = await world(db.pool);
    const { engine } = await w.engine(async ({ sessionId, task }) => {
      writeFileSync(join(await worktreeOf(sessionId), "notes.txt"), "from the node\n");
      return `done ${taskLine(task)}`;
    }, r.options);
    all.push(engine);
    const started = await engine.start(w.ctx(r.ctx), { definition: isolatedNode });
    // a completed workflow's journal is not kept: the run's own copy says what the node handed over
    const run = engine.run(started.workflowId);
    expect((await engine.finished(started.workflowId)).status).toBe("completed");
    const node = run?.journal.nodes.a;
    const branch = r.git("for-each-ref", "--format=%(refname:short)", "refs/heads/crw/");
    expect(r.git("show", `${branch}:notes.txt`)).toBe("from the node");
    expect(node?.handover).toContain(
      `[crw] committed on branch ${branch} at ${r.git("rev-parse", branch).slice(0, 12)}`,
    );
  });

  it("that cannot be committed fails the node, saying why", async () => {
    const r = repository();
    const w = await world(db.pool);
    const { engine } = await w.engine(async ({ sessionId, task }) => {
      const worktree = await worktreeOf(sessionId);
      writeFileSync(join(worktree, "notes.txt"), "from the node\n");
      // another git holds the worktree's index
      const lock = execFileSync("git", ["rev-parse", "--path-format=absolute", "--git-path", "index.lock"], {
        cwd: worktree,
        encoding: "utf8",
      }).trim();
      writeFileSync(lock, "");
      return `done ${taskLine(task)}`;
    }, r.options);
    all.push(engine);
    const started = await engine.start(w.ctx(r.ctx), { definition: isolatedNode });
    expect((await engine.finished(started.workflowId)).status).toBe("failed");
    const node = (await workflowJournal(db.pool, started.workflowId)).nodes.a;
    expect(node?.status).toBe("failed");
    expect(node?.error?.code).toBe("worktree_commit_failed");
    expect(node?.error?.message).toMatch(/^its worktree could not be committed: git add .*index\.lock/);
  });
});
