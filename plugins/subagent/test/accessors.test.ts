import { FileSpillStore, prepareCompletion } from "@crw/brain";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import {
  type CompletionSink,
  parseWorkflowDefinition,
  type SummaryWriter,
  type WorkflowCallContext,
  type WorkflowHostAccessors,
} from "../src/index.js";
import { closeEnginesAfterEach, deferred, summaries, taskLine, until, world } from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

const later =
  <T>(value: T, log: string[], name: string): (() => Promise<T>) =>
  async () => {
    log.push(`${name}:called`);
    await new Promise((r) => setTimeout(r, 5));
    log.push(`${name}:resolved`);
    return value;
  };

describe("the host's live accessors", () => {
  it("the engine awaits each accessor, stores the summary writer and completion sink, and uses them (S004-273 S004-274 S004-276)", async () => {
    const w = await world(db.pool);
    const log: string[] = [];
    const completions: string[] = [];
    const spill = new FileSpillStore(scratchDir("crw-spill-"));
    const writer: SummaryWriter = (summary, outcome, workflowId) =>
      prepareCompletion({
        repo: w.repo,
        spill,
        inlineBytes: 64,
        recipient: {
          sessionId: w.parentSessionId,
          principalAccountId: w.accountId,
          fileName: `workflow-${workflowId}.txt`,
        },
        readHint: "use DelegateRead",
        outcome,
        body: summary,
      });
    const sink: CompletionSink = async (c) => {
      completions.push(c.resultId);
    };
    const accessors: WorkflowHostAccessors & Pick<WorkflowCallContext, "currentAccess" | "currentWorkDir"> = {
      currentAccess: later(
        {
          accountId: w.accountId,
          operator: true,
          target: { kind: "host", ref: null },
          tools: { deny: ["Write"] },
        },
        log,
        "access",
      ),
      currentWorkDir: later("/srv/accessors", log, "cwd"),
      delegationCompletionEmitter: later(sink, log, "completion"),
      captureToolOutputWriter: later(writer, log, "writer"),
      delegatedTurnsOutOfProcess: later(false, log, "outOfProcess"),
      workflowExpansionRpc: later(null, log, "rpc"),
    };
    let engineCompletions = 0;
    const { engine } = await w.engine(({ task }) => `answer of ${taskLine(task)} ${"y".repeat(200)}`, {
      onCompletion: async () => {
        engineCompletions++;
      },
    });
    all.push(engine);
    const def = parseWorkflowDefinition(
      "name: acc\nnodes: [{id: a, task: TASK a}, {id: b, task: TASK b, dependsOn: [a]}]",
    );
    const started = await engine.start(w.ctx({ ...accessors }), { definition: def });
    // Every accessor was awaited (in order) before WorkflowStart returned; in process, no RPC was asked for.
    expect(log).toEqual([
      "access:called",
      "access:resolved",
      "cwd:called",
      "cwd:resolved",
      "completion:called",
      "completion:resolved",
      "writer:called",
      "writer:resolved",
      "outOfProcess:called",
      "outOfProcess:resolved",
    ]);
    const outcome = await engine.finished(started.workflowId);
    expect(completions).toEqual([outcome.resultId]);
    expect(engineCompletions).toBe(0);
    // Each node's child was placed in the origin's working directory, under the origin's access.
    const { rows: scopes } = await db.pool.query(
      "select scope from sessions where parent_session_id = $1::uuid",
      [w.parentSessionId],
    );
    expect(scopes.map((r) => JSON.parse(r.scope)).map((sc) => [sc.workDir, sc.tools.deny])).toEqual([
      ["/srv/accessors", ["Write"]],
      ["/srv/accessors", ["Write"]],
    ]);
    const [result] = await summaries(db.pool, w.parentSessionId);
    expect(result?.body).toMatch(
      /^\[full result: \d+ bytes at .*workflow-.*\.txt; read that path with Read\]/,
    );
    const { rows } = await db.pool.query(
      "select byte_size, spill_id from delegation_results where id = $1::uuid",
      [result?.id],
    );
    expect(Number(rows[0].byte_size)).toBe(Buffer.byteLength(outcome.summary ?? ""));
    expect(rows[0].spill_id).not.toBeNull();
  });

  it("a missing capability is the accessor's null: no sink or writer falls back, no RPC out of process means no expansion (S004-277 S004-276)", async () => {
    const w = await world(db.pool);
    const gate = deferred();
    const sessions: string[] = [];
    let engineCompletions = 0;
    const { engine } = await w.engine(
      async ({ task, sessionId }) => {
        sessions.push(sessionId);
        if (taskLine(task) === "TASK a") await gate.promise;
        return "short";
      },
      {
        onCompletion: async () => {
          engineCompletions++;
        },
      },
    );
    all.push(engine);
    const started = await engine.start(
      w.ctx({ delegatedTurnsOutOfProcess: async () => true, workflowExpansionRpc: async () => null }),
      { definition: parseWorkflowDefinition("name: none\nnodes: [{id: a, task: TASK a}]") },
    );
    await until(() => sessions.length === 1, "a running");
    await expect(
      engine.addNodes({
        workflowId: started.workflowId,
        principalAccountId: w.accountId,
        fromNodeId: "a",
        callerSessionId: sessions[0],
        nodes: [{ id: "x", task: "t" }],
      }),
    ).rejects.toMatchObject({ code: "expansion_unavailable" });
    gate.resolve();
    const outcome = await engine.finished(started.workflowId);
    expect(engineCompletions).toBe(1); // no origin sink: the engine's own completion path
    const [result] = await summaries(db.pool, w.parentSessionId);
    expect(result?.body).toBe(outcome.summary); // no writer: inline
    // With the RPC capability, the same out-of-process node may extend its workflow.
    const gate2 = deferred();
    const sessions2: string[] = [];
    const second = await w.engine(async ({ task, sessionId }) => {
      sessions2.push(sessionId);
      if (taskLine(task) === "TASK a") await gate2.promise;
      return "short";
    });
    all.push(second.engine);
    const started2 = await second.engine.start(
      w.ctx({
        delegatedTurnsOutOfProcess: async () => true,
        workflowExpansionRpc: async () => ({ method: "workflow.addNodes" }),
      }),
      { definition: parseWorkflowDefinition("name: rpc\nnodes: [{id: a, task: TASK a}]") },
    );
    await until(() => sessions2.length === 1, "a running");
    expect(
      await second.engine.addNodes({
        workflowId: started2.workflowId,
        principalAccountId: w.accountId,
        fromNodeId: "a",
        callerSessionId: sessions2[0],
        nodes: [{ id: "x", task: "t", dependsOn: ["a"] }],
      }),
    ).toEqual(["x"]);
    gate2.resolve();
    await second.engine.finished(started2.workflowId);
  });
});
