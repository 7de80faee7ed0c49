#!/usr/bin/env node
// Workflow DAG engine benchmark (built code: run `npx tsup` in packages/db, packages/brain and plugins/subagent
// first). An N-node workflow (default 50; width 10: N/10 - 1 layers of ten, the last node of the last layer
// adding ten more nodes with WorkflowAddNodes) runs with the offline scripted node runner at zero latency on a
// real embedded PostgreSQL (durable defaults), every node a journaled child session. Measures:
//   - end-to-end time and scheduling overhead per node (everything but the model: journal, publication,
//     child creation, grants, artifacts), SQL statements per node, and the bytes per node of the journal
//     writes and snapshot publications (their JSON text: neither should grow with the node count),
//   - the floor it compares with, in the same run: p50 of an autocommit insert on the same server (one
//     durable commit),
//   - time from cancel until nothing runs (ten nodes in flight, the rest pending), summary delivered.
// Wake notifications as in the daemon, whose WakeHub knows nobody follows these workflows and sessions: no
// write notifies. CRW_BENCH_WAKE=all makes every write notify (a process that cannot tell; notifying
// commits are serialized by PostgreSQL's notify lock).
// DATABASE_URL, when set, is used instead of the embedded server. Prints one JSON object, then a summary.
// Usage: node bench/workflow-dag.mjs [runs] [nodes]
import { randomUUID } from "node:crypto";
import { commitFloor, countStatements, startBenchPostgres } from "./lib/postgres.mjs";

const runs = Number(process.argv[2] ?? 3);
const nodes = Number(process.argv[3] ?? 50);
if (!Number.isInteger(nodes) || nodes < 20 || nodes % 10 !== 0)
  throw new Error(`nodes must be a multiple of 10, at least 20 (got ${process.argv[3]})`);
const layers = nodes / 10 - 1;
const expander = `L${layers - 1}-9`;

// Count every statement sent through pg by this process.
const counter = await countStatements();
const db = await import("../packages/db/dist/index.js");
const wf = await import("../plugins/subagent/dist/index.js");
const wake = process.env.CRW_BENCH_WAKE === "all" ? "every write notifies" : "unwatched";
if (wake === "unwatched") db.addWakeFilter(() => false);

const pgServer = await startBenchPostgres("crw-bench-wf-", db.migrate);
const { url } = pgServer;
const pool = db.createPool({ connectionString: url, max: 16 });
// The embedded server stops at the end while idle clients may still be open: that is not a failure.
pool.on("error", () => {});
const repo = new db.PgDelegationRepository(pool);
const account = await repo.createAccount({ name: `bench-${randomUUID()}`, isOwner: true });

// The floor, on the same server in the same run: one durable commit.
const floorMs = (await commitFloor(url)).p50;

function definition() {
  const spec = [];
  for (let layer = 0; layer < layers; layer++) {
    for (let i = 0; i < 10; i++) {
      const deps = layer === 0 ? [] : [`L${layer - 1}-${i}`, `L${layer - 1}-${(i + 1) % 10}`];
      spec.push({ id: `L${layer}-${i}`, task: `TASK L${layer}-${i}`, dependsOn: deps });
    }
  }
  return wf.parseWorkflowDefinition(JSON.stringify({ name: `bench-${nodes}`, nodes: spec }), "json");
}
const expansion = Array.from({ length: 10 }, (_, i) => ({
  id: `X-${i}`,
  task: `TASK X-${i}`,
  dependsOn: [expander],
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
      if (id === expander) {
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

// The JSON text the journal writes and the snapshot publications send.
const bytes = { journal: 0, snapshot: 0 };
const writeJournal = engine.store.writeJournalText.bind(engine.store);
engine.store.writeJournalText = (id, write, ...rest) => {
  bytes.journal += write.header.length + write.nodes.reduce((n, r) => n + r.id.length + r.body.length, 0);
  return writeJournal(id, write, ...rest);
};
const publishSnapshot = engine.store.publishSnapshot.bind(engine.store);
engine.store.publishSnapshot = (id, snapshot, ...rest) => {
  bytes.snapshot += JSON.stringify(snapshot).length;
  return publishSnapshot(id, snapshot, ...rest);
};

async function startOne() {
  const parent = await repo.createRootSession(account.id, "scripted");
  const def = definition();
  const startedAt = performance.now();
  // The script needs the id before the expander runs; it is in the last definition layer.
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
const perNodeStatements = [];
const perNodeBytes = [];
for (let r = 0; r < runs; r++) {
  const before = counter.count();
  const bytesBefore = { ...bytes };
  const { started, startedAt } = await startOne();
  const outcome = await engine.finished(started.workflowId);
  if (outcome.status !== "completed") throw new Error(`run ${r} ended ${outcome.status}`);
  e2e.push(performance.now() - startedAt);
  perNodeStatements.push((counter.count() - before) / nodes);
  perNodeBytes.push({
    journal: (bytes.journal - bytesBefore.journal) / nodes,
    snapshot: (bytes.snapshot - bytesBefore.snapshot) / nodes,
  });
}

// Cancel: ten nodes in flight, the rest pending.
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
  postgres: pgServer.external ? "external" : "embedded (durable defaults)",
  wake,
  nodes,
  width: 10,
  expansion: expansion.length,
  runs,
  endToEndMs: { median: Math.round(median(e2e)), all: e2e.map(Math.round) },
  schedulingOverheadPerNodeMs: Number((median(e2e) / nodes).toFixed(2)),
  commitFloorMs: { p50: floorMs },
  overheadInCommits: Number((median(e2e) / nodes / floorMs).toFixed(1)),
  sqlStatementsPerNode: Number(median(perNodeStatements).toFixed(1)),
  bytesPerNode: {
    journal: Math.round(median(perNodeBytes.map((b) => b.journal))),
    snapshot: Math.round(median(perNodeBytes.map((b) => b.snapshot))),
  },
  cancel: { untilNothingRunsMs: Math.round(cancelMs), interrupted, neverStarted },
};
console.log(JSON.stringify(result));
console.log(
  `workflow-dag (${wake}): ${nodes} nodes (width 10, one expansion of 10) end-to-end ${result.endToEndMs.median} ms median, ` +
    `${result.schedulingOverheadPerNodeMs} ms scheduling overhead per node (${result.overheadInCommits} x the ` +
    `${floorMs} ms commit floor, ${result.sqlStatementsPerNode} statements, journal ${result.bytesPerNode.journal} ` +
    `and snapshot ${result.bytesPerNode.snapshot} bytes); cancel to nothing running ` +
    `${result.cancel.untilNothingRunsMs} ms (${interrupted} interrupted, ${neverStarted} never started)`,
);
