import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { PgDelegationRepository } from "@crw/db";
import { type CrashChildConfig, distIsStale, runCrashChild } from "@crw/tools/delegation";
import { createDatabase, dropDatabase, uniqueDatabaseName } from "@crw/tools/pg";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import { delegateCall, messages, resultIdsIn, scriptTask } from "./helpers.js";

// Each drill gets its own database (cloned from the migrated template), so drills run concurrently without
// one recovery claiming another drill's orphaned runs.
const databases: Array<{ name: string; pool: pg.Pool }> = [];
/** Each drill's directory (its effects log and spills), removed with its database. */
const drillDirs: string[] = [];
afterAll(async () => {
  for (const d of databases) {
    await d.pool.end();
    await dropDatabase(inject("crwPgAdminUrl"), d.name);
  }
  for (const dir of drillDirs) rmSync(dir, { recursive: true, force: true });
});
const root = resolve(import.meta.dirname, "../../../..");

beforeAll(() => {
  // The crash child runs built code: rebuild what is older than its sources.
  for (const pkg of ["packages/db", "packages/brain"]) {
    const dir = join(root, pkg);
    if (!distIsStale(dir)) continue;
    const out = spawnSync("npx", ["tsup"], { cwd: dir, encoding: "utf8", timeout: 110_000 });
    if (out.status !== 0) throw new Error(`build of ${pkg} failed: ${out.stderr}`);
  }
}, 240_000);

/** Three background children: one with an effect, one with a result above the inline limit, one with a helper. */
const PLAN = scriptTask({
  rounds: [
    [
      delegateCall(
        { rounds: [[{ name: "Effect", arguments: { label: "a" } }]], answer: "A done" },
        { background: true },
      ),
      delegateCall({ answer: `B ${"b".repeat(600)}` }, { background: true }),
      delegateCall(
        {
          rounds: [
            [
              delegateCall(
                { rounds: [[{ name: "Effect", arguments: { label: "g", delayMs: 300 } }]], answer: "G done" },
                { background: true },
              ),
            ],
          ],
          answer: "C done",
        },
        { background: true },
      ),
    ],
  ],
  answer: "delegated",
});

async function scenario() {
  const name = uniqueDatabaseName("crw_crash");
  const url = await createDatabase(inject("crwPgAdminUrl"), name, inject("crwPgTemplate"));
  const pool = new pg.Pool({ connectionString: url, max: 4 });
  databases.push({ name, pool });
  const db = { pool, url };
  const repo = new PgDelegationRepository(pool);
  const account = await repo.createAccount({ name: `crash-${Math.random().toString(36).slice(2)}` });
  const parent = await repo.createRootSession(account.id, "scripted");
  const dir = mkdtempSync(join(tmpdir(), "crw-crash-"));
  drillDirs.push(dir);
  const effectsFile = join(dir, "effects.log");
  writeFileSync(effectsFile, "");
  const config: CrashChildConfig = {
    databaseUrl: db.url,
    spillRoot: join(dir, "spill"),
    effectsFile,
    inlineBytes: 256,
    start: { accountId: account.id, parentSessionId: parent.id, prompt: PLAN },
  };
  const { start: _start, ...recoverOnly } = config;
  return { repo, account, parent, config, recoverOnly, effectsFile, db };
}

async function assertExactlyOnce(s: Awaited<ReturnType<typeof scenario>>) {
  const { repo, account, parent, effectsFile, db } = s;
  // every result of the root is in its journal exactly once
  const rootIds = resultIdsIn(await repo.readJournal(parent.id, account.id));
  const rootRuns = await db.pool.query("select 1 from subagent_runs where parent_session_id = $1", [
    parent.id,
  ]);
  // a kill can come before the parent recorded all three delegations; each one it recorded delivers once
  expect(rootRuns.rowCount).toBeGreaterThan(0);
  expect(rootIds).toHaveLength(rootRuns.rowCount ?? -1);
  expect(new Set(rootIds).size).toBe(rootIds.length);
  const rootResults = await db.pool.query<{ id: string }>(
    "select id from delegation_results where parent_session_id = $1",
    [parent.id],
  );
  expect(new Set(rootIds)).toEqual(new Set(rootResults.rows.map((r) => r.id)));
  // across the whole tree: nothing open, nothing waiting, no result journaled twice
  const sessions = await db.pool.query<{ id: string }>(
    "select id from sessions where principal_account_id = $1",
    [account.id],
  );
  for (const { id } of sessions.rows) {
    const ids = resultIdsIn(await repo.readJournal(id, account.id));
    expect(new Set(ids).size).toBe(ids.length);
    const intents = (await repo.readJournal(id, account.id)).flatMap((e) =>
      e.body.type === "tool_intent" ? [e.body.toolCallId] : [],
    );
    const results = messages(await repo.readJournal(id, account.id)).flatMap((m) =>
      m.role === "toolResult" ? [m.toolCallId] : [],
    );
    for (const call of intents) expect(results.filter((r) => r === call)).toHaveLength(1);
  }
  const open = await db.pool.query(
    "select 1 from subagent_runs where principal_account_id = $1 and status in ('queued','running','settling')",
    [account.id],
  );
  expect(open.rowCount).toBe(0);
  const unacked = await db.pool.query(
    `select 1 from delegation_results r where r.principal_account_id = $1
        and not exists (select 1 from delegation_result_acks a where a.result_id = r.id)`,
    [account.id],
  );
  expect(unacked.rowCount).toBe(0);
  // no tool call ran twice
  const lines = readFileSync(effectsFile, "utf8").split("\n").filter(Boolean);
  expect(new Set(lines).size).toBe(lines.length);
  return lines;
}

describe("crash injection: SIGKILL at named points, then boot recovery", () => {
  it.concurrent("an uninterrupted run delivers every result once and runs every effect once", async () => {
    const s = await scenario();
    const exit = await runCrashChild(s.config);
    expect(exit.code, exit.stderr).toBe(0);
    const lines = await assertExactlyOnce(s);
    expect(lines).toHaveLength(2);
    expect(resultIdsIn(await s.repo.readJournal(s.parent.id, s.account.id))).toHaveLength(3);
    const runs = await s.db.pool.query<{ status: string; recovery_attempts: number }>(
      "select status, recovery_attempts from subagent_runs where principal_account_id = $1",
      [s.account.id],
    );
    expect(runs.rows.every((r) => r.status === "succeeded" && r.recovery_attempts === 0)).toBe(true);
  });

  const points = [
    "child.settled",
    "delivery.between_append_and_ack",
    "delivery.after_commit",
    "drain.during",
    "spill.during",
    "tool.after_intent:Effect",
    "tool.after_effect:Effect",
  ];
  for (const point of points) {
    it.concurrent(`killed at ${point}: after restart every result is delivered exactly once and no tool call ran twice`, async () => {
      const s = await scenario();
      const crashed = await runCrashChild(s.config, point);
      expect(crashed.signal, `${point} was never reached: ${crashed.stdout}${crashed.stderr}`).toBe(
        "SIGKILL",
      );
      const recovered = await runCrashChild(s.recoverOnly);
      expect(recovered.code, recovered.stderr + recovered.stdout).toBe(0);
      await assertExactlyOnce(s);
    });
  }

  it.concurrent("a continuation after a SIGKILL is charged one recovery attempt, still recorded once the call succeeded (S004-142)", async () => {
    const s = await scenario();
    const crashed = await runCrashChild(s.config, "tool.after_effect:Effect");
    expect(crashed.signal).toBe("SIGKILL");
    const recovered = await runCrashChild(s.recoverOnly);
    expect(recovered.code, recovered.stderr).toBe(0);
    const lines = await assertExactlyOnce(s);
    const runs = await s.db.pool.query<{ task: string; recovery_attempts: number; status: string }>(
      "select task, recovery_attempts, status from subagent_runs where parent_session_id = $1",
      [s.parent.id],
    );
    const a = runs.rows.find((r) => r.task.includes("A done"));
    // the attempt the continuation charged stays on the run after it completed
    expect(a?.status).toBe("succeeded");
    expect(a?.recovery_attempts).toBe(1);
    // the effect that ran before the kill is not repeated: its call is reported as of unknown outcome
    const childA = await s.db.pool.query<{ child_session_id: string }>(
      "select child_session_id from subagent_runs where parent_session_id = $1 and task like '%A done%'",
      [s.parent.id],
    );
    const childMsgs = messages(
      await s.repo.readJournal(childA.rows[0]?.child_session_id ?? "", s.account.id),
    );
    const effectResults = childMsgs.filter((m) => m.role === "toolResult" && m.toolName === "Effect");
    expect(effectResults).toHaveLength(1);
    expect(effectResults[0]).toMatchObject({
      isError: true,
      content: expect.stringMatching(/outcome is unknown/),
    });
    expect(lines.filter((l) => l.startsWith(childA.rows[0]?.child_session_id ?? "-"))).toHaveLength(1);
  });

  describe("on the real agent loop", () => {
    const steps = (list: unknown[]) => JSON.stringify({ steps: list });
    const AGENT_PLAN = steps([
      {
        toolCalls: [
          {
            name: "Delegate",
            arguments: {
              task: steps([
                { toolCalls: [{ name: "Effect", arguments: { label: "a" } }] },
                { text: "A done" },
              ]),
              background: true,
            },
          },
          {
            name: "Delegate",
            arguments: {
              task: steps([
                { toolCalls: [{ name: "Effect", arguments: { label: "b" } }] },
                { text: "B done" },
              ]),
              background: true,
            },
          },
        ],
      },
      { text: "delegated" },
    ]);
    for (const point of ["tool.after_effect:Effect", "delivery.between_append_and_ack", "child.settled"]) {
      it.concurrent(`killed at ${point}: results exactly once, no effect repeated`, async () => {
        const s = await scenario();
        const config = {
          ...s.config,
          runner: "agent" as const,
          start: { ...(s.config.start as NonNullable<CrashChildConfig["start"]>), prompt: AGENT_PLAN },
        };
        const crashed = await runCrashChild(config, point);
        expect(crashed.signal, `${point} was never reached: ${crashed.stdout}${crashed.stderr}`).toBe(
          "SIGKILL",
        );
        const recovered = await runCrashChild({ ...s.recoverOnly, runner: "agent" });
        expect(recovered.code, recovered.stderr + recovered.stdout).toBe(0);
        const lines = await assertExactlyOnce(s);
        expect(lines.length).toBeLessThanOrEqual(2);
      });
    }
  });
});
