import { readFileSync } from "node:fs";
import { RESTART_REQUIRED_ALERT_KEY } from "@crw/subagent";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { afterAll, describe, expect, it } from "vitest";
import { alertsPath } from "../src/index.js";
import { steps, TestClient } from "./support/client.js";
import { ownerHealth } from "./support/health.js";
import { type DaemonProcess, spawnDaemon } from "./support/process.js";

const db = useTestDatabase();
const daemons: DaemonProcess[] = [];

afterAll(async () => {
  for (const d of daemons)
    if (d.child.exitCode === null && d.child.signalCode === null) d.child.kill("SIGKILL");
  // Their data directories go after this file's tests (test/setup.ts): once the processes are gone.
  await Promise.all(daemons.map((d) => d.exited));
});

describe("the restart-required alert of the daemon's own pool", { timeout: 120_000 }, () => {
  it("the daemon attaches the restart-required sink to the pool it constructs: a runner of another build raises the alert once (S004-165)", async () => {
    const dataDir = scratchDir("crw-daemon-mismatch-");
    // Its runners announce a build identity other than the daemon's (as after an upgrade in place).
    const daemon = await spawnDaemon({
      dataDir,
      databaseUrl: db.url,
      env: { CRW_RUNNER_FAULT: "other-build" },
      runtime: { maxRunners: 1 },
    });
    daemons.push(daemon);
    const client = await TestClient.connect(daemon.url, daemon.token);
    try {
      const { sessionId } = await client.ok<{ sessionId: string }>("session.create");
      // Two delegations: the latch refuses the second at once, and the alert is still raised only once.
      for (const n of [1, 2]) {
        const receipt = await client.ok<{ kind: string; outcome: string; body: string }>("session.delegate", {
          sessionId,
          task: steps({ text: `child ${n}` }),
        });
        // The parent gets the startup failure through the delegated tool failure path, never a replay here.
        expect(receipt).toMatchObject({ kind: "result", outcome: "error" });
        expect(receipt.body).toMatch(/build/);
      }
      const health = (await ownerHealth(daemon.url, dataDir)) as {
        pool: { restartRequired: boolean; spawnFailure: unknown };
        alerts: { key: string; count: number; severity: string }[];
      };
      expect(health.pool).toMatchObject({
        restartRequired: true,
        spawnFailure: { category: "build_mismatch", state: "latched" },
      });
      expect(health.alerts).toEqual([
        expect.objectContaining({ key: RESTART_REQUIRED_ALERT_KEY, count: 1, severity: "warning" }),
      ]);
      const stored = JSON.parse(readFileSync(alertsPath(dataDir), "utf8")) as { alerts: { key: string }[] };
      expect(stored.alerts.map((a) => a.key)).toEqual([RESTART_REQUIRED_ALERT_KEY]);
    } finally {
      client.close();
      daemon.child.kill("SIGTERM");
      expect(await daemon.exited).toBe("0");
    }
  });
});
