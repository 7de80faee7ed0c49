// A daemon-like process that drives workflows against a real PostgreSQL, loading the engine from its
// TypeScript source (through jiti), so it needs no build and never runs stale code. It may SIGKILL itself
// at a named fault point of the engine (CRW_WORKFLOW_FAULT), or in the middle of a node's turn (the turn
// started and its context is known, nothing is answered yet).
//
// Config (JSON in CRW_WORKFLOW_CHILD): { databaseUrl, turnsFile, failTask?, killInTurn?, start?: { accountId,
// parentSessionId, toolCallId, definition }, resume?: { workflowId, accountId, parentSessionId, toolCallId } }.
// It boots with recovery first, then starts or resumes the workflow, waits for every workflow it drives,
// prints one JSON line (what recovery claimed, the outcomes, and each run's journal as it ended) and exits 0.
// Every turn appends one fsynced JSON line to turnsFile as it starts: its pid, child, task and context.
import { closeSync, fsyncSync, openSync, writeSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { PgDelegationRepository } from "@crw/db";
import { createJiti } from "jiti";
import pg from "pg";

const jiti = createJiti(import.meta.url);
const { hostAccessors, JournalNodeDispatcher, scriptedNodeTurnRunner, WorkflowEngine } = await jiti.import(
  fileURLToPath(new URL("../../src/index.ts", import.meta.url)),
);

const cfg = JSON.parse(process.env.CRW_WORKFLOW_CHILD ?? "{}");
const pool = new pg.Pool({ connectionString: cfg.databaseUrl, max: 6 });
const repo = new PgDelegationRepository(pool);

function turn(line) {
  const fd = openSync(cfg.turnsFile, "a");
  try {
    writeSync(fd, `${JSON.stringify(line)}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

const ended = {};
const engine = new WorkflowEngine({
  pool,
  owner: `child-${process.pid}-${Date.now()}`,
  dispatcher: new JournalNodeDispatcher(
    repo,
    scriptedNodeTurnRunner(async ({ sessionId, task, context }) => {
      const first = task.split("\n")[0];
      turn({
        pid: process.pid,
        sessionId,
        task: first,
        context: context.map((m) => (m.role === "custom" ? `custom:${m.customType}` : m.role)),
      });
      if (cfg.killInTurn === first) process.kill(process.pid, "SIGKILL");
      if (cfg.failTask === first) throw new Error("provider down");
      return `did ${first}`;
    }),
  ),
  defaultModel: "scripted",
  repo,
  onEvent: (e) => {
    if (e.type !== "workflow") return;
    const j = engine.run(e.workflowId)?.journal;
    if (j)
      ended[e.workflowId] = {
        recovery: { ...j.recovery },
        run: j.run,
        dispatches: j.dispatches,
        maxDispatches: j.definition.maxDispatches,
      };
  },
});
await engine.open();
const recovered = await engine.recoverInterrupted();
const ids = [...recovered.resumed];
const ctxOf = (s) => ({
  parentSessionId: s.parentSessionId,
  principalAccountId: s.accountId,
  toolCallId: s.toolCallId,
  currentAccess: async () => ({
    accountId: s.accountId,
    operator: true,
    target: { kind: "host", ref: null },
  }),
  currentWorkDir: async () => null,
  ...hostAccessors(),
});
if (cfg.start) {
  const started = await engine.start(ctxOf(cfg.start), { definition: cfg.start.definition });
  ids.push(started.workflowId);
}
if (cfg.resume) {
  await engine.resume(ctxOf(cfg.resume), cfg.resume.workflowId);
  ids.push(cfg.resume.workflowId);
}
const outcomes = await Promise.all(
  ids.map((id) => engine.finished(id).catch((e) => ({ workflowId: id, error: String(e) }))),
);
process.stdout.write(`${JSON.stringify({ recovered, outcomes, ended })}\n`);
await engine.close();
await pool.end();
