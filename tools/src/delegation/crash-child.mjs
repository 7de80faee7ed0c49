// A process that runs delegations against a real PostgreSQL and may be SIGKILLed at a named fault point
// (CRW_FAULT, see @crw/brain's faults). It runs built code (dist), so build @crw/db and @crw/brain first.
//
// Config (JSON in CRW_CRASH_CONFIG):
//   { databaseUrl, spillRoot, effectsFile, inlineBytes?, runner?: "scripted" | "agent",
//     start?: { accountId, parentSessionId, prompt } }
// `runner: "agent"` runs turns on the real agent loop (pi-agent-core) with its offline scripted provider.
// It always boots with recovery first, then (with `start`) prompts the root session, then waits until no
// run is open and no result waits for delivery, and exits 0 printing one JSON line.
import { closeSync, fsyncSync, openSync, writeSync } from "node:fs";
import {
  createAgentTurnRunner,
  createScriptedTurnRunner,
  DelegationService,
  FileSpillStore,
  recoverDelegations,
} from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import pg from "pg";

const cfg = JSON.parse(process.env.CRW_CRASH_CONFIG ?? "{}");
const pool = new pg.Pool({ connectionString: cfg.databaseUrl, max: 8 });

/** A tool with an effect outside the database: one fsynced line per call, so a test can count runs. */
const effectTool = {
  name: "Effect",
  description: "records that it ran",
  parameters: {},
  mutates: true,
  async execute(args, ctx) {
    if (typeof args.delayMs === "number")
      await new Promise((r) => setTimeout(r, Math.min(args.delayMs, 2000)));
    const fd = openSync(cfg.effectsFile, "a");
    try {
      writeSync(fd, `${ctx.sessionId} ${ctx.toolCallId}\n`);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    return { content: `effect ${String(args.label ?? "")} done` };
  },
};

const service = new DelegationService({
  repo: new PgDelegationRepository(pool),
  runner: cfg.runner === "agent" ? createAgentTurnRunner() : createScriptedTurnRunner(),
  spill: new FileSpillStore(cfg.spillRoot),
  tools: () => [effectTool],
  toolResultInlineBytes: () => cfg.inlineBytes ?? 32 * 1024,
  helperWaitMs: 100,
});

const report = await recoverDelegations(service);
if (cfg.start) await service.prompt(cfg.start.parentSessionId, cfg.start.accountId, cfg.start.prompt);

// Quiescence, bounded: every wait here has a deadline.
const deadline = Date.now() + (cfg.quiesceMs ?? 60_000);
for (;;) {
  await service.whenIdle();
  const open = await pool.query(
    "select count(*)::int as n from subagent_runs where status in ('queued','running','settling')",
  );
  const queued = await pool.query(
    "select count(*)::int as n from delegation_results r where not exists (select 1 from delegation_result_acks a where a.result_id = r.id)",
  );
  if (open.rows[0].n === 0 && queued.rows[0].n === 0) break;
  if (Date.now() > deadline) {
    process.stdout.write(
      `${JSON.stringify({ ok: false, open: open.rows[0].n, queued: queued.rows[0].n })}\n`,
    );
    process.exit(3);
  }
  await new Promise((r) => setTimeout(r, 50));
}
await service.close();
await pool.end();
process.stdout.write(`${JSON.stringify({ ok: true, report })}\n`);
