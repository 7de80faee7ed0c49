import { useTestDatabase } from "@crw/tools/pg";
import { afterEach, describe, expect, it } from "vitest";
import {
  handleWorkflowAddNodes,
  type OrchestrationJournal,
  PgWorkflowStore,
  parseWorkflowDefinition,
  readOrchestrationJournal,
} from "../src/index.js";
import { deferred, summaries, taskLine, until, untilAborted, world } from "./helpers.js";

const db = useTestDatabase();
const all: Array<{ close: () => Promise<void> }> = [];
// Each engine holds its owner lease on one pooled connection: let go after every test.
afterEach(async () => {
  for (const e of all.splice(0)) await e.close();
});

const diamond = parseWorkflowDefinition(`
name: diamond
agentTypes:
  reviewer: { model: scripted-review }
nodes:
  - { id: a, task: "TASK a", agentType: helper }
  - { id: b, task: "TASK b", dependsOn: [a], agentType: reviewer }
  - { id: c, task: "TASK c", dependsOn: [a], agentType: reviewer, tools: { allow: ["Read"] } }
  - { id: d, task: "TASK d", dependsOn: [b, c], model: scripted-final }
`);

async function journalOf(workflowId: string): Promise<OrchestrationJournal> {
  const reading = readOrchestrationJournal(await new PgWorkflowStore(db.pool).readJournal(workflowId));
  if (!reading.ok) throw new Error(reading.reason);
  return reading.journal;
}

describe("running a workflow", () => {
  it("ready nodes run (independent ones together) and each gets only its direct dependencies' short handovers, never their turns (S004-341 S004-300)", async () => {
    const w = await world(db.pool);
    const prompts = new Map<string, string>();
    const bothRunning = deferred();
    let running = 0;
    const { engine } = await w.engine(async ({ task }) => {
      const id = taskLine(task).replace("TASK ", "");
      prompts.set(id, task);
      if (id === "b" || id === "c") {
        running++;
        if (running === 2) bothRunning.resolve();
        await bothRunning.promise; // b and c are in flight at the same time
      }
      // b answers at length: its dependents get the head of it and the artifact's address, not all of it
      return id === "b" ? `answer of b\n${"detail ".repeat(500)}\nEND OF B` : `answer of ${id}`;
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: diamond });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("completed");
    expect(prompts.get("a")).toBe("TASK a");
    expect(prompts.get("b")).toContain("--- a");
    expect(prompts.get("b")).toContain("answer of a");
    const d = prompts.get("d") ?? "";
    expect(d).toContain("answer of b");
    expect(d).toContain("answer of c");
    expect(d).not.toContain("answer of a"); // an indirect dependency's handover never reaches d
    expect(d).not.toContain("END OF B");
    expect(d).toMatch(/--- b \(full result: [^)]+\)\nanswer of b\n/);
    expect(d).toContain("(truncated; the full result is in the shared artifact)");
    expect(d.length).toBeLessThan(3000);
    // the dependencies' own turns (their tasks) are no part of it
    expect(d).not.toMatch(/TASK [abc]/);
  });

  it("the parent receives one whole-workflow summary and no node result; nodes have no run rows (S004-066 S004-132)", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(({ task }) => `done: ${taskLine(task)}`);
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: diamond });
    await engine.finished(started.workflowId);
    const results = await summaries(db.pool, w.parentSessionId);
    expect(results).toHaveLength(1);
    expect(results[0]?.kind).toBe("workflow_summary");
    expect(results[0]?.outcome).toBe("ok");
    expect(results[0]?.body).toContain('Workflow "diamond"');
    expect(results[0]?.body).toMatch(/- d: succeeded/);
    const runs = await db.pool.query(
      "select count(*)::int n from subagent_runs where parent_session_id = $1::uuid",
      [w.parentSessionId],
    );
    expect(runs.rows[0].n).toBe(0);
    const children = await db.pool.query(
      "select count(*)::int n from sessions where parent_session_id = $1::uuid",
      [w.parentSessionId],
    );
    expect(children.rows[0].n).toBe(4);
    // The delegation core's own inbox read sees it queued for the parent.
    expect(await w.repo.queuedResultIds(w.parentSessionId, w.accountId)).toEqual([results[0]?.id]);
  });

  it("the version-2 journal holds node access and model maps, type-model pins, the run number and a handover per completed node (S004-301)", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    const { engine } = await w.engine(async ({ task }) => {
      if (taskLine(task) === "TASK d") await gate.promise;
      return `handover from ${taskLine(task)}`;
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: diamond });
    await until(async () => (await journalOf(started.workflowId)).nodes.d?.status === "running", "d running");
    const j = await journalOf(started.workflowId);
    expect(j.version).toBe(2);
    expect(j.run).toBe(1);
    expect(j.recovery).toEqual({ workflowGeneration: 1, recoveryAdmissionVersion: 1 });
    // helper names no model: pinned to the default when its first node was prepared
    expect(j.typeModelPins).toEqual({ reviewer: "scripted-review", helper: "scripted" });
    expect(j.nodeModels).toEqual({
      a: "scripted",
      b: "scripted-review",
      c: "scripted-review",
      d: "scripted-final",
    });
    expect(Object.keys(j.nodeAccess).sort()).toEqual(["a", "b", "c", "d"]);
    expect(JSON.parse(j.nodeAccess.c ?? "{}").tools.allow).toEqual(["Read"]);
    for (const id of ["a", "b", "c"]) expect(j.nodes[id]?.handover).toBe(`handover from TASK ${id}`);
    expect(j.nodes.d?.handover).toBeUndefined();
    expect(j.dispatches).toBe(4);
    gate.resolve();
    await engine.finished(started.workflowId);
  });

  it("a failed node blocks its dependents while independent nodes go on", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: partial
nodes:
  - { id: bad, task: "TASK bad" }
  - { id: after, task: "TASK after", dependsOn: [bad] }
  - { id: later, task: "TASK later", dependsOn: [after] }
  - { id: free, task: "TASK free" }
`);
    const ran: string[] = [];
    const { engine } = await w.engine(({ task }) => {
      ran.push(taskLine(task));
      if (taskLine(task) === "TASK bad") throw new Error("provider said no");
      return "fine";
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("failed");
    expect(ran.sort()).toEqual(["TASK bad", "TASK free"]);
    expect(outcome.summary).toContain("- bad: failed: provider said no");
    expect(outcome.summary).toContain("- after: blocked: dependency bad failed");
    expect(outcome.summary).toContain("- later: blocked: dependency after blocked");
    expect(outcome.summary).toContain("- free: succeeded");
  });

  it("refuses an answer that does not match the node's output schema", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: typed
nodes:
  - { id: j, task: "TASK j", outputSchema: { type: object, properties: { ok: { type: boolean } }, required: [ok] } }
  - { id: k, task: "TASK k", outputSchema: { type: object, properties: { ok: { type: boolean } }, required: [ok] } }
`);
    const { engine } = await w.engine(({ task }) =>
      taskLine(task) === "TASK j" ? '{"ok": true}' : '{"ok": "yes"}',
    );
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.summary).toContain("- j: succeeded");
    expect(outcome.summary).toMatch(/- k: failed: the answer does not match the output schema at ok/);
  });

  it("cancel interrupts a running node, never starts a pending one, and says which in the summary (S004-284)", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: stop-me
nodes:
  - { id: slow, task: "TASK slow" }
  - { id: next, task: "TASK next", dependsOn: [slow] }
`);
    const ran: string[] = [];
    const { engine } = await w.engine(async ({ task, signal }) => {
      ran.push(taskLine(task));
      return untilAborted(signal);
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    await until(() => ran.length === 1, "slow running");
    // Another account cannot stop it.
    const other = await world(db.pool);
    await expect(engine.cancel(started.workflowId, other.accountId)).rejects.toMatchObject({
      code: "not_running",
    });
    const outcome = await engine.cancel(started.workflowId, w.accountId);
    expect(outcome.status).toBe("cancelled");
    expect(ran).toEqual(["TASK slow"]);
    expect(outcome.summary).toContain("- slow: interrupted while running");
    expect(outcome.summary).toContain("- next: cancelled before it started");
    const results = await summaries(db.pool, w.parentSessionId);
    expect(results.map((r) => r.body)).toEqual([outcome.summary]);
    const row = await db.pool.query("select status from workflows where id = $1::uuid", [started.workflowId]);
    expect(row.rows[0].status).toBe("cancelled");
  });
});

describe("WorkflowAddNodes", () => {
  it("a running node adds nodes; they are journaled before the ids are reported and inherit its access (S004-286 S004-293 S004-294)", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: expand
nodes:
  - { id: plan, task: "TASK plan", tools: { allow: ["Read", "Bash(git *)"], deny: ["Write"] }, readOnly: true }
`);
    let engineRef: import("../src/index.js").WorkflowEngine | undefined;
    let workflowId = "";
    let reported: string[] = [];
    let journaledBeforeReport = false;
    const { engine, dispatcher } = await w.engine(async ({ task, sessionId }) => {
      if (taskLine(task) === "TASK plan") {
        reported = await (engineRef as import("../src/index.js").WorkflowEngine).addNodes({
          workflowId,
          principalAccountId: w.accountId,
          fromNodeId: "plan",
          callerSessionId: sessionId,
          nodes: [
            { id: "part1", task: "TASK part1", dependsOn: ["plan"] },
            {
              id: "part2",
              task: "TASK part2",
              dependsOn: ["plan"],
              tools: { allow: ["Bash(git status)"] },
            },
          ],
        });
        journaledBeforeReport = Boolean((await journalOf(workflowId)).nodes.part2);
        return "planned two parts";
      }
      return `did ${taskLine(task)}`;
    });
    engineRef = engine;
    all.push(engine);
    // Journal writes land late: ids reported before their write was awaited would be seen unjournaled.
    const write = engine.store.writeJournalText.bind(engine.store);
    engine.store.writeJournalText = async (...args) => {
      await new Promise((r) => setTimeout(r, 30));
      return write(...args);
    };
    const started = await engine.start(w.ctx({ currentWorkDir: async () => "/srv/expand" }), {
      definition: def,
    });
    workflowId = started.workflowId;
    // The node may have started before workflowId was known to the script: wait for the expansion.
    const outcome = await engine.finished(started.workflowId);
    expect(reported).toEqual(["part1", "part2"]);
    expect(journaledBeforeReport).toBe(true);
    expect(outcome.status).toBe("completed");
    expect(outcome.summary).toContain("- part1: succeeded");
    const { rows } = await db.pool.query(
      "select id, scope from sessions where parent_session_id = $1::uuid order by created_at",
      [w.parentSessionId],
    );
    const scopes = rows.map((r) => ({ ...JSON.parse(r.scope), sessionId: String(r.id) }));
    expect(scopes).toHaveLength(3);
    // part1 and part2 start together: tell them apart by what they asked for, not by creation order.
    const plan = scopes[0];
    const part2 = scopes.slice(1).find((x) => JSON.stringify(x.tools.allow) === '["Bash(git status)"]');
    const part1 = scopes.slice(1).find((x) => x !== part2);
    expect(part1.target).toEqual(plan.target);
    expect(part1.accountId).toBe(w.accountId);
    expect(part1.readOnly).toBe(true); // read-only provenance carried over
    expect(part1.permissionBoundary).toBe("read-only");
    expect(part1.tools).toEqual(plan.tools); // tool restrictions carried over
    expect(plan.workDir).toBe("/srv/expand");
    expect(part1.workDir).toBe(plan.workDir);
    expect(part2.tools.allow).toEqual(["Bash(git status)"]); // only narrows
    expect(part2.tools.deny).toContain("Write");
    // Through the journal and the dispatch path the added node's child stays continuable under the parent.
    expect(
      await dispatcher.continueNode({
        workflowId: started.workflowId,
        nodeId: "part1",
        childSessionId: part1.sessionId,
        parentSessionId: w.parentSessionId,
        principalAccountId: w.accountId,
        model: "scripted",
        scope: JSON.stringify(part1),
        signal: new AbortController().signal,
      }),
    ).toEqual({ status: "answered", reply: "did TASK part1" });
  });

  it("refuses an expansion with a cycle, an unknown dependency or a caller that is not the running node", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    const { engine } = await w.engine(async () => {
      await gate.promise;
      return "ok";
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), {
      definition: parseWorkflowDefinition("name: g\nnodes: [{id: a, task: t}]"),
    });
    await until(async () => (await journalOf(started.workflowId)).nodes.a?.status === "running", "a running");
    const add = (nodes: unknown, from?: string, caller?: string) =>
      engine.addNodes({
        workflowId: started.workflowId,
        principalAccountId: w.accountId,
        nodes,
        fromNodeId: from,
        callerSessionId: caller,
      });
    await expect(
      add([
        { id: "x", task: "t", dependsOn: ["y"] },
        { id: "y", task: "t", dependsOn: ["x"] },
      ]),
    ).rejects.toMatchObject({ code: "dependency_cycle" });
    await expect(add([{ id: "x", task: "t", dependsOn: ["nope"] }])).rejects.toMatchObject({
      code: "unknown_dependency",
    });
    await expect(
      add([{ id: "x", task: "t" }], "a", "00000000-0000-4000-8000-000000000000"),
    ).rejects.toMatchObject({ code: "node_not_running" });
    expect(Object.keys((await journalOf(started.workflowId)).nodes)).toEqual(["a"]);
    gate.resolve();
    await engine.finished(started.workflowId);
  });

  it("a runner's workflow.addNodes host call runs the same mutation, admitted only for the calling running node (S004-286)", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    const sessions: string[] = [];
    const { engine } = await w.engine(async ({ sessionId, task }) => {
      sessions.push(sessionId);
      if (taskLine(task) === "TASK root") await gate.promise;
      return `did ${taskLine(task)}`;
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), {
      definition: parseWorkflowDefinition('name: rpc\nnodes: [{id: root, task: "TASK root"}]'),
    });
    await until(() => sessions.length === 1, "root running");
    const params = {
      workflowId: started.workflowId,
      nodes: [{ id: "leaf", prompt: "TASK leaf", dependsOn: ["root"] }],
    };
    await expect(
      handleWorkflowAddNodes(engine, params, { sessionId: w.parentSessionId }),
    ).rejects.toMatchObject({ code: "node_not_running" });
    await expect(
      handleWorkflowAddNodes(
        engine,
        { ...params, workflowId: "00000000-0000-4000-8000-000000000000" },
        { sessionId: sessions[0] as string },
      ),
    ).rejects.toMatchObject({ code: "node_not_running" });
    expect(await handleWorkflowAddNodes(engine, params, { sessionId: sessions[0] as string })).toEqual({
      added: ["leaf"],
    });
    expect((await journalOf(started.workflowId)).nodes.leaf?.addedBy).toBe("root");
    gate.resolve();
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.summary).toContain("- leaf: succeeded");
  });
});
