import { mkdir, realpath } from "node:fs/promises";
import { join } from "node:path";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import { PgWorkflowStore, parseWorkflowDefinition, pgWorkflowEmitter } from "../src/index.js";
import { closeEnginesAfterEach, deferred, taskLine, until, world } from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

async function scopes(
  parent: string,
): Promise<Array<{ workDir: string | null; target: unknown; projectRef: string | null }>> {
  const { rows } = await db.pool.query(
    "select scope from sessions where parent_session_id = $1::uuid order by created_at",
    [parent],
  );
  return rows.map((r) => JSON.parse(r.scope));
}

describe("node placement", () => {
  it("the engine awaits the origin's cwd, and every node cwd is validated and persisted through delegatedWorkDir; a refused placement keeps its typed cause (S004-275 S004-292)", async () => {
    const project = await realpath(scratchDir("crw-proj-"));
    await mkdir(join(project, "pkg", "db"), { recursive: true });
    const w = await world(db.pool);
    const { engine, events } = await w.engine(({ task }) => `ok ${taskLine(task)}`, {
      workDirPolicy: async () => ({ kind: "scoped", project: { ref: "proj", root: project } }),
    });
    all.push(engine);
    const def = parseWorkflowDefinition(`
name: placed
nodes:
  - { id: inside, task: "TASK inside", cwd: pkg/db }
  - { id: escape, task: "TASK escape", cwd: ../.. }
  - { id: missing, task: "TASK missing", cwd: pkg/nope }
  - { id: plain, task: "TASK plain" }
`);
    const started = await engine.start(
      w.ctx({
        access: { target: { kind: "host", ref: "proj" }, projectRef: "proj" },
        currentWorkDir: async () => {
          await new Promise((r) => setTimeout(r, 20));
          return project;
        },
      }),
      { definition: def },
    );
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.summary).toContain("- inside: succeeded");
    expect(outcome.summary).toMatch(
      /- escape: failed: node escape could not be prepared: working directory is outside the selected project/,
    );
    expect(outcome.summary).toMatch(/- missing: failed: node missing could not be prepared/);
    expect(outcome.summary).toContain("- plain: succeeded");
    // The preparation failure keeps the placement's own typed error as its cause.
    const failure = events.find((e) => e.type === "node_error" && e.nodeId === "escape");
    const error = failure?.type === "node_error" ? failure.error : undefined;
    expect(error?.name).toBe("WorkflowNodePreparationError");
    expect(error?.cause).toMatchObject({ name: "DelegatedScopeError", code: "work_dir_outside_project" });
    const placed = await scopes(w.parentSessionId);
    expect(placed).toHaveLength(2); // refused placements created no child
    const byDir = [...placed].sort((a, b) => String(b.workDir).length - String(a.workDir).length);
    expect(byDir[0]).toMatchObject({
      workDir: join(project, "pkg", "db"),
      target: { kind: "host", ref: "proj" },
      projectRef: "proj",
    });
    expect(byDir[1]).toMatchObject({ workDir: project, target: { kind: "host", ref: "proj" } });
  });

  it("a node cwd without a placement policy is refused, never guessed", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(() => "ok");
    all.push(engine);
    const started = await engine.start(w.ctx(), {
      definition: parseWorkflowDefinition("name: p\nnodes: [{id: a, task: t, cwd: /tmp}]"),
    });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.summary).toContain(
      "- a: failed: node a could not be prepared: this host cannot place a node in a working directory",
    );
  });
});

describe("publication ordering", () => {
  it("results reach dependents only after their snapshot; completion drains, then publishes, then summarizes; the journal stays until then (S004-281 S004-285)", async () => {
    const w = await world(db.pool);
    const store = new PgWorkflowStore(db.pool);
    const inner = pgWorkflowEmitter(store);
    const hold = deferred();
    let holdNext = false;
    const seen: Array<{ status: string; journal: boolean; summaries: number; nodes: string }> = [];
    const ran: string[] = [];
    const { engine } = await w.engine(
      ({ task }) => {
        ran.push(taskLine(task));
        return `ok ${taskLine(task)}`;
      },
      {
        emitter: async (update, expected) => {
          const nodes = update.snapshot.nodes.map((n) => `${n.id}:${n.status}`).join(",");
          if (expected !== undefined) {
            const j = await db.pool.query(
              "select count(*)::int n from workflow_journals where workflow_id = $1::uuid",
              [update.workflowId],
            );
            const r = await db.pool.query(
              "select count(*)::int n from delegation_results where parent_session_id = $1::uuid",
              [w.parentSessionId],
            );
            seen.push({ status: update.status, journal: j.rows[0].n === 1, summaries: r.rows[0].n, nodes });
          }
          if (holdNext && nodes.startsWith("a:succeeded")) {
            holdNext = false;
            await hold.promise;
          }
          return inner(update, expected);
        },
      },
    );
    all.push(engine);
    holdNext = true;
    const def = parseWorkflowDefinition(`
name: ordered
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);
    const started = await engine.start(w.ctx(), { definition: def });
    await until(() => seen.some((s) => s.nodes.startsWith("a:succeeded")), "a's result snapshot queued");
    await new Promise((r) => setTimeout(r, 50));
    expect(ran).toEqual(["TASK a"]); // b waits for a's artifact/grant snapshot
    hold.resolve();
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("completed");
    expect(ran).toEqual(["TASK a", "TASK b"]);
    const terminal = seen.at(-1);
    expect(terminal).toMatchObject({ status: "completed", journal: true, summaries: 0 });
    const { rows } = await db.pool.query(
      "select count(*)::int n from workflow_journals where workflow_id = $1::uuid",
      [started.workflowId],
    );
    expect(rows[0].n).toBe(0); // removed with the summary handoff, after terminal publication settled
  });

  it("normal completion waits for the publication still pending, then prepares the summary and returns it (S004-282)", async () => {
    const w = await world(db.pool);
    const inner = pgWorkflowEmitter(new PgWorkflowStore(db.pool));
    const log: string[] = [];
    const { engine } = await w.engine(({ task }) => `ok ${taskLine(task)}`, {
      emitter: async (update, expected) => {
        const what = `${update.status} ${update.snapshot.nodes.map((n) => `${n.id}:${n.status}`).join(",")}`;
        // the last node's snapshot is slow: it is still being written when the workflow completes
        if (update.status === "running" && what.endsWith("b:succeeded"))
          await new Promise((r) => setTimeout(r, 300));
        const result = await inner(update, expected);
        log.push(`published ${what}`);
        return result;
      },
    });
    all.push(engine);
    const writer = async (summary: string) => {
      log.push("summary prepared");
      return { body: summary, byteSize: Buffer.byteLength(summary) };
    };
    const def = parseWorkflowDefinition(`
name: drained
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);
    const started = await engine.start(w.ctx({ captureToolOutputWriter: async () => writer }), {
      definition: def,
    });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("completed");
    expect(outcome.summary).toContain("- b: succeeded");
    const prepared = log.indexOf("summary prepared");
    expect(log.slice(0, prepared)).toContain("published running a:succeeded,b:succeeded");
    expect(log[prepared - 1]).toBe("published completed a:succeeded,b:succeeded");
    expect(log.slice(prepared)).toEqual(["summary prepared"]);
  });
});
