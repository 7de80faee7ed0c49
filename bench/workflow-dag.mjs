#!/usr/bin/env node
// Workflow DAG engine benchmark (built code: run `npx tsup` in packages/db, packages/brain and plugins/subagent
// first). A 50-node workflow (width 10: four layers of ten, the last node of layer 3 adding ten more nodes
// with WorkflowAddNodes) runs with the offline scripted node runner at zero latency on a real embedded
// PostgreSQL (durable defaults), every node a journaled child session. Measures:
//   - end-to-end time and scheduling overhead per node (everything but the model: journal, publication,
//     child creation, grants, artifacts),
//   - time from cancel until nothing runs (ten nodes in flight, forty pending), summary delivered.
// DATABASE_URL, when set, is used instead of the embedded server. Prints one JSON object, then a summary.
// Usage: node bench/workflow-dag.mjs [runs]
import { randomUUID } from "node:crypto";
import pg from "pg";
import { startBenchPostgres } from "./lib/postgres.mjs";

const runs = Number(process.argv[2] ?? 3);
const db = await import("../packages/db/dist/index.js");
const wf = await import("../plugins/subagent/dist/index.js");

const pgServer = await startBenchPostgres("crw-bench-wf-", db.migrate);
const { url } = pgServer;
const pool = new pg.Pool({ connectionString: url, max: 16 });
// The embedded server stops at the end while idle clients may still be open: that is not a failure.
pool.on("error", () => {});
const repo = new db.PgDelegationRepository(pool);
const account = await repo.createAccount({ name: `bench-${randomUUID()}`, isOwner: true });

function definition() {
  const nodes = [];
  for (let layer = 0; layer < 4; layer++) {
    for (let i = 0; i < 10; i++) {
      const deps = layer === 0 ? [] : [`L${layer - 1}-${i}`, `L${layer - 1}-${(i + 1) % 10}`];
      nodes.push({ id: `L${layer}-${i}`, task: `TASK L${layer}-${i}`, dependsOn: deps });
    }
  }
  return wf.parseWorkflowDefinition(JSON.stringify({ name: "bench-50", nodes }), "json");
}
const expansion = Array.from({ length: 10 }, (_, i) => ({
  id: `X-${i}`,
  task: `TASK X-${i}`,
  dependsOn: ["L3-9"],
}));

let engineRef;
let current = "";
let blockAll = false;
let running = 0;
const engine = new wf.WorkflowEngine({
  pool,
  owner: `bench-${process.pid}`,
  repo,
  defaultModel: "scripted",
  dispatcher: new wf.JournalNodeDispatcher(
    repo,
    wf.scriptedNodeTurnRunner(async ({ task, sessionId, signal }) => {
      const id = task.split("\n")[0].replace("TASK ", "");
      if (blockAll) {
        running++;
        try {
          await new Promise((_, reject) =>
            signal.addEventListener("abort", () => reject(new Error("aborted")), { once: true }),
          );
        } finally {
          running--;
        }
      }
      if (id === "L3-9") {
        await engineRef.addNodes({
          workflowId: current,
          principalAccountId: account.id,
          fromNodeId: id,
          callerSessionId: sessionId,
          nodes: expansion,
        });
      }
      return `done ${id}`;
    }),
  ),
});
engineRef = engine;
await engine.open();

async function startOne() {
  const parent = await repo.createRootSession(account.id, "scripted");
  const def = definition();
  const startedAt = performance.now();
  // The script needs the id before the expander runs; L3-9 is four layers away.
  const p = engine.start(
    {
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: `bench-${randomUUID()}`,
      currentAccess: async () => ({
        accountId: account.id,
        operator: true,
        target: { kind: "host", ref: null },
      }),
      currentWorkDir: async () => null,
      ...wf.hostAccessors(),
    },
    { definition: def },
  );
  const started = await p;
  current = started.workflowId;
  return { started, startedAt, parent };
}

const e2e = [];
for (let r = 0; r < runs; r++) {
  const { started, startedAt } = await startOne();
  const outcome = await engine.finished(started.workflowId);
  if (outcome.status !== "completed") throw new Error(`run ${r} ended ${outcome.status}`);
  e2e.push(performance.now() - startedAt);
}
const nodes = 50;

// Cancel: ten nodes in flight, forty pending.
blockAll = true;
const { started } = await startOne();
while (running < 10) await new Promise((r) => setTimeout(r, 2));
const cancelAt = performance.now();
const cancelled = await engine.cancel(started.workflowId, account.id);
const cancelMs = performance.now() - cancelAt;
if (running !== 0) throw new Error("nodes still running after cancel");
const interrupted = (cancelled.summary.match(/interrupted while running/g) ?? []).length;
const neverStarted = (cancelled.summary.match(/cancelled before it started/g) ?? []).length;

await engine.close();
await pool.end();
await pgServer.stop();

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const result = {
  bench: "workflow-dag",
  nodes,
  width: 10,
  expansion: expansion.length,
  runs,
  endToEndMs: { median: Math.round(median(e2e)), all: e2e.map(Math.round) },
  schedulingOverheadPerNodeMs: Number((median(e2e) / nodes).toFixed(2)),
  cancel: { untilNothingRunsMs: Math.round(cancelMs), interrupted, neverStarted },
};
console.log(JSON.stringify(result));
console.log(
  `workflow-dag: 50 nodes (width 10, one expansion of 10) end-to-end ${result.endToEndMs.median} ms median, ` +
    `${result.schedulingOverheadPerNodeMs} ms scheduling overhead per node; cancel to nothing running ` +
    `${result.cancel.untilNothingRunsMs} ms (${interrupted} interrupted, ${neverStarted} never started)`,
);
