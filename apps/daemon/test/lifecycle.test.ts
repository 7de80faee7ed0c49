import { readFileSync, writeFileSync } from "node:fs";
import { captureDelegatedExecutionScope } from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import { RESTART_REQUIRED_ALERT_KEY, restartRequiredAlert, SubagentRunnerPool } from "@crw/subagent";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { pino } from "pino";
import { describe, expect, it, vi } from "vitest";
import { AlertService, alertsPath, loadConfig, ownerTokenPath, startDaemon } from "../src/index.js";
import { steps, TestClient } from "./support/client.js";
import { ownerHealth } from "./support/health.js";

const silent = pino({ level: "silent" });
const db = useTestDatabase();

const config = (dataDir: string, extra: object = {}) =>
  loadConfig({ env: { DATABASE_URL: db.url }, overrides: { dataDir, port: 0, ...extra } });

describe("daemon lifecycle", () => {
  it("raising the restart-required alert again updates the same condition (S004-168)", async () => {
    const dir = scratchDir("crw-alerts-");
    const alerts = await AlertService.open(dir);
    const { key, severity, audience, text } = restartRequiredAlert;
    await alerts.raise({ key, severity, audience, text });
    await alerts.raise({ key, severity, audience, text });
    expect(alerts.list()).toEqual([expect.objectContaining({ key, count: 2, severity: "warning" })]);
    // Durable: a new process reads the same single condition.
    expect((await AlertService.open(dir)).list()).toEqual([expect.objectContaining({ key, count: 2 })]);
  });

  it("on startup the daemon clears the old process's restart-required alert before attaching its sink; other alerts stay (S004-169)", async () => {
    const dataDir = scratchDir("crw-daemon-alerts-");
    const old = {
      version: 1,
      alerts: [
        {
          ...restartRequiredAlert,
          text: { ...restartRequiredAlert.text },
          raisedAt: new Date().toISOString(),
          count: 1,
        },
        {
          key: "other:condition",
          severity: "info",
          audience: "administrators",
          text: { en: "x" },
          raisedAt: "t",
          count: 1,
        },
      ],
    };
    writeFileSync(alertsPath(dataDir), JSON.stringify(old));
    // Observed, not assumed: the clear has completed before the pool's sink is attached, so a latch of the
    // new process can never be wiped by the old process's cleanup.
    const order: string[] = [];
    const clear = AlertService.prototype.clear;
    const attach = SubagentRunnerPool.prototype.attachRestartRequiredSink;
    const spies = [
      vi.spyOn(AlertService.prototype, "clear").mockImplementation(async function (this: AlertService, key) {
        await clear.call(this, key);
        order.push(`cleared ${key}`);
      }),
      vi.spyOn(SubagentRunnerPool.prototype, "attachRestartRequiredSink").mockImplementation(function (
        this: SubagentRunnerPool,
        sink,
      ) {
        order.push("sink attached");
        attach.call(this, sink);
      }),
    ];
    const daemon = await startDaemon(config(dataDir), { log: silent }).finally(() => {
      for (const spy of spies) spy.mockRestore();
    });
    try {
      expect(order).toEqual([`cleared ${RESTART_REQUIRED_ALERT_KEY}`, "sink attached"]);
      const health = (await ownerHealth(daemon.state.url, daemon.config.dataDir)) as {
        alerts: { key: string }[];
      };
      expect(health.alerts.map((a) => a.key)).toEqual(["other:condition"]);
      const file = JSON.parse(readFileSync(alertsPath(dataDir), "utf8")) as { alerts: { key: string }[] };
      expect(file.alerts.map((a) => a.key)).not.toContain(RESTART_REQUIRED_ALERT_KEY);
    } finally {
      await daemon.stop();
    }
  });

  it("boot recovery claims interrupted calls before the API port opens, and the resumed child runs in a runner", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const account = await repo.createAccount({ name: `boot-${Date.now()}` });
    const parent = await repo.createRootSession(account.id, "scripted");
    const scope = captureDelegatedExecutionScope({
      accountId: account.id,
      target: { kind: "host", ref: null },
    });
    const runs = [];
    for (let i = 0; i < 3; i++) {
      const { run } = await repo.createDelegation({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: `boot-${i}`,
        task: steps({ text: `recovered child ${i}` }),
        mode: "background",
        model: "scripted",
        scope,
      });
      // Started by a process that is gone (it holds no owner lease): what a SIGKILLed daemon leaves.
      await repo.startRun(run.id, run.generation, "a-daemon-that-died");
      runs.push(run);
    }
    const dataDir = scratchDir("crw-daemon-boot-");
    const daemon = await startDaemon(config(dataDir), { log: silent });
    try {
      // The port is open only now: every interrupted call was already claimed and continued once; each
      // was waiting on its model (nothing of unknown outcome), so the continuation is not charged.
      const { rows } = await db.pool.query(
        "select recovery_attempts, free_continuations, generation from subagent_runs where id = any($1::uuid[])",
        [runs.map((r) => r.id)],
      );
      expect(
        rows.every((r) => r.recovery_attempts === 0 && r.free_continuations === 1 && r.generation > 1),
      ).toBe(true);
      const health = (await ownerHealth(daemon.state.url, daemon.config.dataDir)) as {
        recovery: { delegations: { continued: string[] }; finishedAt: string };
      };
      expect(health.recovery.delegations.continued.sort()).toEqual(runs.map((r) => r.id).sort());
      expect(Date.parse(health.recovery.finishedAt)).toBeLessThanOrEqual(
        Date.parse(daemon.state.startedAt) + 60_000,
      );
      await daemon.runtime.service.whenIdle();
      expect(await repo.settledResultIds(parent.id, account.id)).toHaveLength(3);
      expect(daemon.runtime.placements.runner).toBeGreaterThanOrEqual(3);
    } finally {
      await daemon.stop();
    }
  });

  it("with the switch off, or an operator maximum of zero runners, delegated turns run in the daemon (S004-441 S004-518)", async () => {
    for (const runtime of [{ subagentRunnerEnabled: false }, { maxRunners: 0 }]) {
      const dataDir = scratchDir("crw-daemon-local-");
      const daemon = await startDaemon(config(dataDir, { runtime }), { log: silent });
      const client = await TestClient.connect(
        daemon.state.url,
        readFileSync(ownerTokenPath(dataDir), "utf8").trim(),
      );
      try {
        const { sessionId } = await client.ok<{ sessionId: string }>("session.create");
        const r = await client.ok<{ kind: string; body: string }>("session.delegate", {
          sessionId,
          task: steps({ text: "ran here" }),
        });
        expect(r).toMatchObject({ kind: "result", body: "ran here" });
        // The child's turn ran here (the root parent's follow-up turn may run here too; roots always do).
        expect(daemon.runtime.placements.runner).toBe(0);
        expect(daemon.runtime.placements["in-process"]).toBeGreaterThanOrEqual(1);
        const health = (await ownerHealth(daemon.state.url, daemon.config.dataDir)) as {
          pool: { mode: string };
        };
        expect(health.pool.mode).toBe("in-process");
      } finally {
        client.close();
        await daemon.stop();
      }
    }
  });

  it("a graceful stop with work in flight terminalizes nothing; the next start finishes it, each result once", async () => {
    const dataDir = scratchDir("crw-daemon-stop-");
    const first = await startDaemon(config(dataDir, { shutdownGraceMs: 0 }), { log: silent });
    const token = readFileSync(ownerTokenPath(dataDir), "utf8").trim();
    const client = await TestClient.connect(first.state.url, token);
    const { sessionId } = await client.ok<{ sessionId: string }>("session.create");
    const children = Array.from({ length: 6 }, (_, i) => ({
      name: "Delegate",
      arguments: { task: steps({ text: `child ${i}` }), background: true },
    }));
    await client.ok("session.send", { sessionId, text: steps({ toolCalls: children }, { text: "sent" }) });
    client.close();
    await first.stop("test");
    const { rows: failed } = await db.pool.query(
      "select count(*)::int as n from subagent_runs where parent_session_id = $1::uuid and status in ('failed','aborted')",
      [sessionId],
    );
    expect(failed[0].n).toBe(0);
    const second = await startDaemon(config(dataDir), { log: silent });
    try {
      const until = Date.now() + 60_000;
      for (;;) {
        const { rows } = await db.pool.query(
          `select count(*) filter (where status = 'succeeded')::int as ok, count(*)::int as total
             from subagent_runs where parent_session_id = $1::uuid`,
          [sessionId],
        );
        const acks = await db.pool.query(
          "select count(*)::int as n from delegation_result_acks where parent_session_id = $1::uuid",
          [sessionId],
        );
        if (rows[0].ok === 6 && acks.rows[0].n === 6) break;
        if (Date.now() > until)
          throw new Error(`not finished: ${JSON.stringify(rows[0])}, acks ${acks.rows[0].n}`);
        await new Promise((r) => setTimeout(r, 100));
      }
      const dup = await db.pool.query(
        "select result_id from journal_entries where session_id = $1::uuid and result_id is not null and not discarded group by result_id having count(*) > 1",
        [sessionId],
      );
      expect(dup.rows).toEqual([]);
    } finally {
      await second.stop();
    }
  });
});
