import { randomUUID } from "node:crypto";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import {
  createScriptedTurnRunner,
  DelegationService,
  FileSpillStore,
  type MutatingTool,
  scriptTask,
} from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import {
  boundedProjectFileReader,
  delegationNodeTurns,
  JournalNodeDispatcher,
  subagentTools,
  WorkflowEngine,
  workflowTools,
} from "../src/index.js";
import { until } from "./helpers.js";

const db = useTestDatabase();

/**
 * A delegation service whose sessions get the workflow tools (reading `project`), and the workflow engine
 * those tools drive: node turns run as delegated child sessions, completions wake their parent.
 */
function wiredWithWorkflowTools(
  project: string,
  spillRoot: string,
  inlineBytes?: number,
  extra: MutatingTool[] = [],
) {
  const repo = new PgDelegationRepository(db.pool);
  let engine!: WorkflowEngine;
  const reader = boundedProjectFileReader({ root: project });
  let service!: DelegationService;
  service = new DelegationService({
    repo,
    runner: createScriptedTurnRunner(),
    spill: new FileSpillStore(spillRoot),
    ...(inlineBytes !== undefined && { toolResultInlineBytes: () => inlineBytes }),
    tools: (session) => [
      ...extra,
      ...workflowTools({
        service,
        engine,
        session,
        readOnly: false,
        reader,
        currentWorkDir: async () => null,
      }),
    ],
  });
  engine = new WorkflowEngine({
    pool: db.pool,
    owner: `wf-${randomUUID()}`,
    dispatcher: new JournalNodeDispatcher(repo, delegationNodeTurns(service)),
    defaultModel: "scripted",
    repo,
    onCompletion: (c) => service.resultQueued(c.parentSessionId, c.principalAccountId, c.resultId),
  });
  return { repo, service, engine, reader };
}

describe("the Sub-agent plugin's tools", () => {
  it("a parent's WorkflowStart reads the project file; a node's WorkflowAddNodes expands the DAG from inside its turn (S004-341 S004-286)", async () => {
    const project = scratchDir("crw-proj-");
    const { repo, service, engine, reader } = wiredWithWorkflowTools(project, scratchDir("crw-spill-"));
    try {
      await service.start();
      await engine.open();
      const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
      const parent = await repo.createRootSession(account.id, "scripted");
      const planTask = scriptTask({
        rounds: [
          [
            {
              name: "WorkflowAddNodes",
              arguments: { nodes: [{ id: "fix", task: "apply the fix", dependsOn: ["plan"] }] },
            },
          ],
        ],
        answer: "planned one fix",
        followUp: "noted",
      });
      await writeFile(
        join(project, "wf.json"),
        JSON.stringify({
          name: "tooling",
          nodes: [
            { id: "plan", task: planTask },
            { id: "check", task: "check things" },
          ],
        }),
      );
      await service.prompt(
        parent.id,
        account.id,
        scriptTask({
          rounds: [[{ name: "WorkflowStart", arguments: { path: "wf.json" } }]],
          answer: "started",
          followUp: "noted",
        }),
      );
      const { rows } = await db.pool.query("select id from workflows where parent_session_id = $1::uuid", [
        parent.id,
      ]);
      expect(rows).toHaveLength(1);
      const workflowId = String(rows[0].id);
      const outcome = await engine.finished(workflowId);
      expect(outcome.status).toBe("completed");
      // a workflow that ended before finished() was asked answers from its record: the summary is in its result
      const summary =
        outcome.summary ??
        String(
          (await db.pool.query("select body from delegation_results where id = $1", [outcome.resultId]))
            .rows[0]?.body,
        );
      expect(summary).toContain("- plan: succeeded");
      expect(summary).toContain("- fix: succeeded");
      await until(
        async () => (await repo.settledResultIds(parent.id, account.id)).includes(outcome.resultId as string),
        "summary delivered",
      );
      // The parent's transcript shows the tool's receipt, then the one summary.
      const messages = (await repo.readJournal(parent.id, account.id)).flatMap((e) =>
        e.body.type === "message" ? [e.body.message] : [],
      );
      const toolResult = messages.find((m) => m.role === "toolResult" && m.toolName === "WorkflowStart");
      expect(toolResult && "content" in toolResult && String(toolResult.content)).toContain(
        `Workflow ${workflowId} started`,
      );
      // A session that is not a running node has no WorkflowAddNodes; the full set includes Delegate.
      const names = subagentTools({
        service,
        engine,
        session: parent,
        readOnly: false,
        reader,
        currentWorkDir: async () => null,
      }).map((t) => t.name);
      expect(names).toEqual([
        "Delegate",
        "DelegateContinue",
        "DelegateRead",
        "WorkflowStart",
        "WorkflowResume",
        "WorkflowCancel",
        "WorkflowRead",
      ]);
      await service.whenIdle();
    } finally {
      await engine.close();
      await service.close();
    }
  });

  it("a workflow ending while the child that started it waits on a live helper starts the child's result turn at once (S004-048)", async () => {
    const project = scratchDir("crw-proj-");
    // Two gates: the workflow's one node waits at "node", the child's background helper at "helper".
    const opener: Record<string, () => void> = {};
    const gates = Object.fromEntries(
      ["node", "helper"].map((k) => [k, new Promise<void>((r) => (opener[k] = r))] as const),
    );
    const open = (key: string) => opener[key]?.();
    const gateTool: MutatingTool = {
      name: "Gate",
      description: "waits for the test",
      parameters: { type: "object", properties: { key: { type: "string" } } },
      mutates: false,
      execute: async (args) => {
        await gates[String(args.key)];
        return { content: "open" };
      },
    };
    const { repo, service, engine } = wiredWithWorkflowTools(project, scratchDir("crw-spill-"), undefined, [
      gateTool,
    ]);
    try {
      await service.start();
      await engine.open();
      const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
      const parent = await repo.createRootSession(account.id, "scripted");
      const gated = (key: string) =>
        scriptTask({ rounds: [[{ name: "Gate", arguments: { key } }]], answer: key });
      await writeFile(
        join(project, "one.json"),
        JSON.stringify({ name: "one", nodes: [{ id: "a", task: gated("node") }] }),
      );
      const helper = gated("helper");
      const call = service.delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: "starts-a-workflow",
        task: scriptTask({
          rounds: [
            [
              { name: "WorkflowStart", arguments: { path: "one.json" } },
              { name: "Delegate", arguments: { task: helper, background: true } },
            ],
          ],
          answer: "child answered",
          followUp: "child took",
        }),
        mode: "foreground",
      });
      let child = "";
      let workflowId = "";
      await until(async () => {
        child = (await repo.runForToolCall(parent.id, "starts-a-workflow", account.id))?.childSessionId ?? "";
        if (!child) return false;
        const r = await db.pool.query("select id from workflows where parent_session_id = $1::uuid", [child]);
        workflowId = String(r.rows[0]?.id ?? "");
        return workflowId !== "";
      }, "the child's workflow");
      // the child's turn ends and its call waits on its helper; only then does the workflow end
      await until(async () => {
        const journal = await repo.readJournal(child, account.id);
        const answered = journal.some(
          (e) =>
            e.body.type === "message" &&
            e.body.message.role === "assistant" &&
            e.body.message.content.some((c) => c.type === "text" && c.text === "child answered"),
        );
        return answered && !service.turns.isBusy(child);
      }, "the child's answer");
      open("node");
      const outcome = await engine.finished(workflowId);
      // the summary's turn: after the summary in the child's journal, the child answers again, while its
      // helper still waits at the gate
      await until(async () => {
        const journal = await repo.readJournal(child, account.id);
        const at = journal.findIndex(
          (e) =>
            e.body.type === "message" &&
            e.body.message.role === "custom" &&
            e.body.message.details?.resultId === outcome.resultId,
        );
        return (
          at > 0 &&
          journal.slice(at).some((e) => e.body.type === "message" && e.body.message.role === "assistant")
        );
      }, "the summary's own turn");
      expect((await repo.openChildRuns(child, account.id)).length).toBe(1);
      open("helper");
      expect(await call).toMatchObject({ kind: "result", outcome: "ok" });
      await service.whenIdle();
    } finally {
      open("node");
      open("helper");
      await engine.close();
      await service.close();
    }
  });

  it("a summary above the inline limit reaches the parent's inbox as a placeholder, the whole of it spilled for the parent (S004-235)", async () => {
    const project = scratchDir("crw-proj-");
    const { repo, service, engine } = wiredWithWorkflowTools(project, scratchDir("crw-spill-"), 600);
    try {
      await service.start();
      await engine.open();
      const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
      const parent = await repo.createRootSession(account.id, "scripted");
      const long = (n: number) => scriptTask({ rounds: [], answer: `${n}: ${"findings ".repeat(40)}` });
      await writeFile(
        join(project, "wide.json"),
        JSON.stringify({ name: "wide", nodes: [1, 2, 3].map((n) => ({ id: `n${n}`, task: long(n) })) }),
      );
      await service.prompt(
        parent.id,
        account.id,
        scriptTask({
          rounds: [[{ name: "WorkflowStart", arguments: { path: "wide.json" } }]],
          answer: "started",
          followUp: "noted",
        }),
      );
      const { rows } = await db.pool.query("select id from workflows where parent_session_id = $1::uuid", [
        parent.id,
      ]);
      const outcome = await engine.finished(String(rows[0].id));
      expect(outcome.status).toBe("completed");
      const summary = outcome.summary as string;
      expect(Buffer.byteLength(summary)).toBeGreaterThan(600);
      const row = (
        await db.pool.query("select body, spill_id from delegation_results where id = $1", [outcome.resultId])
      ).rows[0] as { body: string; spill_id: string | null };
      // the row the parent's inbox holds was written prepared: a placeholder naming the spilled file
      const path = /^\[full result: \d+ bytes at (\S+); read that path with Read\]/.exec(row.body)?.[1];
      expect(path, row.body).toBeDefined();
      expect(row.spill_id).not.toBeNull();
      expect(await readFile(path as string, "utf8")).toBe(summary);
      expect(await repo.spilledOutput(parent.id, account.id, path as string)).toMatchObject({
        byteSize: Buffer.byteLength(summary),
      });
      await service.whenIdle();
    } finally {
      await engine.close();
      await service.close();
    }
  });

  it("WorkflowStart refuses a bad definition as a typed tool error, changing nothing, and without a project reader reads nothing from the host", async () => {
    const project = scratchDir("crw-proj-");
    await writeFile(
      join(project, "dup.yaml"),
      "name: d\nnodes:\n  - {id: a, task: t}\n  - {id: a, task: t}\n",
    );
    const repo = new PgDelegationRepository(db.pool);
    const service = new DelegationService({
      repo,
      runner: createScriptedTurnRunner(),
      spill: new FileSpillStore(project),
    });
    const engine = new WorkflowEngine({
      pool: db.pool,
      owner: `wf-${randomUUID()}`,
      dispatcher: new JournalNodeDispatcher(repo, delegationNodeTurns(service)),
      defaultModel: "scripted",
      repo,
    });
    const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
    const parent = await repo.createRootSession(account.id, "scripted");
    const [start] = workflowTools({
      service,
      engine,
      session: parent,
      readOnly: false,
      reader: boundedProjectFileReader({ root: project }),
      currentWorkDir: async () => null,
    });
    const ctx = {
      sessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "t1",
      readOnly: false,
      workDir: null,
      signal: new AbortController().signal,
      progress: () => {},
    };
    await expect(start?.execute({ path: "dup.yaml" }, ctx)).rejects.toMatchObject({ code: "duplicate_node" });
    await expect(start?.execute({ path: "../etc/passwd" }, ctx)).rejects.toMatchObject({
      code: "definition_unreadable",
    });
    // A session without a project reader: a valid definition sits in its own directory, and is not read.
    await writeFile(
      join(project, "ok.json"),
      JSON.stringify({ name: "ok", nodes: [{ id: "a", task: "t" }] }),
    );
    const [unread] = workflowTools({
      service,
      engine,
      session: parent,
      readOnly: false,
      reader: null,
      currentWorkDir: async () => project,
    });
    for (const path of ["ok.json", join(project, "ok.json")])
      await expect(unread?.execute({ path }, { ...ctx, workDir: project })).rejects.toMatchObject({
        code: "expansion_unavailable",
      });
    const { rows } = await db.pool.query(
      "select count(*)::int n from workflows where parent_session_id = $1::uuid",
      [parent.id],
    );
    expect(rows[0].n).toBe(0);
  });

  it("a foreground WorkflowStart returns the one summary as its result, acknowledged once in the parent's journal", async () => {
    const project = scratchDir("crw-proj-");
    await writeFile(
      join(project, "fg.yaml"),
      "name: fg\nnodes:\n  - {id: a, task: look}\n  - {id: b, task: check, dependsOn: [a]}\n",
    );
    const { repo, service, engine } = wiredWithWorkflowTools(project, project);
    try {
      await service.start();
      await engine.open();
      const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
      const parent = await repo.createRootSession(account.id, "scripted");
      await service.prompt(
        parent.id,
        account.id,
        scriptTask({
          rounds: [[{ name: "WorkflowStart", arguments: { path: "fg.yaml", foreground: true } }]],
          answer: "done",
          followUp: "noted",
        }),
      );
      await service.whenIdle();
      const { rows } = await db.pool.query(
        "select id, summary_result_id from workflows where parent_session_id = $1::uuid",
        [parent.id],
      );
      const resultId = String(rows[0].summary_result_id);
      const messages = (await repo.readJournal(parent.id, account.id)).flatMap((e) =>
        e.body.type === "message" ? [e.body.message] : [],
      );
      const carrying = messages.filter(
        (m) => (m.role === "toolResult" || m.role === "custom") && m.details?.resultId === resultId,
      );
      expect(carrying).toHaveLength(1);
      expect(carrying[0]?.role).toBe("toolResult");
      expect(carrying[0] && "content" in carrying[0] ? carrying[0].content : "").toContain('Workflow "fg"');
      expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([]);
    } finally {
      await engine.close();
      await service.close();
    }
  });
});
