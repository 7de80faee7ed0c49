import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { PgDelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { beforeAll, describe, expect, it } from "vitest";
import { PgWorkflowStore, readOrchestrationJournal, WORKFLOW_FAULT_POINTS } from "../src/index.js";

/**
 * Real daemon-like processes (support-crash/source-child.mjs, the engine loaded from its source) SIGKILLed
 * at the engine's fault points or in the middle of a node's turn, then a fresh process booting over what
 * they left in PostgreSQL.
 */
const db = useTestDatabase();
const sourceChild = resolve(import.meta.dirname, "support-crash/source-child.mjs");

type Turn = { pid: number; sessionId: string; task: string; context: string[] };
type Ended = { recovery: unknown; run: number; dispatches: number; maxDispatches: number };

function runChild(
  config: unknown,
  fault?: string,
): Promise<{ code: number | null; signal: string | null; stdout: string; stderr: string; pid?: number }> {
  return new Promise((done, fail) => {
    const env: NodeJS.ProcessEnv = { ...process.env, CRW_WORKFLOW_CHILD: JSON.stringify(config) };
    delete env.NODE_OPTIONS;
    delete env.CRW_WORKFLOW_FAULT;
    if (fault) env.CRW_WORKFLOW_FAULT = fault;
    const p = spawn(process.execPath, [sourceChild], { env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d) => (stdout += String(d)));
    p.stderr.on("data", (d) => (stderr += String(d)));
    const timer = setTimeout(() => p.kill("SIGKILL"), 90_000);
    p.on("error", fail);
    p.on("exit", (code, signal) => {
      clearTimeout(timer);
      done({ code, signal, stdout, stderr, ...(p.pid !== undefined ? { pid: p.pid } : {}) });
    });
  });
}

/** The last JSON line a process printed (its report). */
function reportOf(stdout: string): { ended?: Record<string, Ended>; outcomes?: Array<{ status?: string }> } {
  return JSON.parse(stdout.trim().split("\n").at(-1) || "{}");
}

function turnsIn(file: string): Turn[] {
  let text = "";
  try {
    text = readFileSync(file, "utf8").trim();
  } catch {
    return [];
  }
  return text ? text.split("\n").map((l) => JSON.parse(l) as Turn) : [];
}

async function journalOf(workflowId: string) {
  const r = readOrchestrationJournal(await new PgWorkflowStore(db.pool).readJournal(workflowId));
  if (!r.ok) throw new Error(r.reason);
  return r.journal;
}

const definition = {
  version: 1,
  name: "crashy",
  // Exactly one dispatch per node: any second charge fails a node, and with it the workflow.
  maxDispatches: 4,
  defaults: {},
  agentTypes: {},
  nodes: [
    { id: "a", task: "TASK a", dependsOn: [] },
    { id: "b", task: "TASK b", dependsOn: ["a"] },
    { id: "c", task: "TASK c", dependsOn: ["a"] },
    { id: "d", task: "TASK d", dependsOn: ["b", "c"] },
  ],
};

/**
 * At each fault point: a process starting the workflow is SIGKILLed there. The host then records a newer
 * recovery admission on the native row (as a host's recovery claim does), and a fresh process boots. The
 * rows after the kill and after the boot, every turn and the boot's journal as the run ended are recorded.
 */
describe.each(WORKFLOW_FAULT_POINTS)("a daemon process SIGKILLed at %s while a workflow runs", (fault) => {
  let killed: Awaited<ReturnType<typeof runChild>>;
  let booted: Awaited<ReturnType<typeof runChild>>;
  let workflows: Array<{ id: string; status: string }>;
  let children: string[];
  let empty: string[];
  let turns: Turn[];
  let results: unknown[];
  let runs: number;
  let afterKill: { generation: number; recovery_admission_version: number; dispatches: number };
  let afterBoot: Record<string, unknown>;
  let ended: Ended | undefined;

  beforeAll(async () => {
    const repo = new PgDelegationRepository(db.pool);
    const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
    const parent = await repo.createRootSession(account.id, "scripted");
    const turnsFile = join(scratchDir("crw-wf-crash-"), "turns");
    const base = { databaseUrl: db.url, turnsFile };
    killed = await runChild(
      {
        ...base,
        start: { accountId: account.id, parentSessionId: parent.id, toolCallId: `call-${fault}`, definition },
      },
      fault,
    );
    const { rows: wf } = await db.pool.query(
      "select id::text, generation, recovery_admission_version from workflows where parent_session_id = $1::uuid",
      [parent.id],
    );
    const id = String(wf[0]?.id);
    afterKill = {
      generation: Number(wf[0]?.generation),
      recovery_admission_version: Number(wf[0]?.recovery_admission_version),
      dispatches: (await journalOf(id)).dispatches,
    };
    await db.pool.query(
      "update workflows set recovery_admission_version = recovery_admission_version + 1 where id = $1::uuid",
      [id],
    );
    booted = await runChild(base);
    ended = reportOf(booted.stdout).ended?.[id];
    workflows = (
      await db.pool.query("select id::text, status from workflows where parent_session_id = $1::uuid", [
        parent.id,
      ])
    ).rows;
    afterBoot = (
      await db.pool.query(
        "select status, generation, recovery_admission_version from workflows where id = $1::uuid",
        [id],
      )
    ).rows[0];
    children = (
      await db.pool.query("select id::text from sessions where parent_session_id = $1::uuid", [parent.id])
    ).rows.map((r) => String(r.id));
    empty = (
      await db.pool.query(
        `select s.id::text from sessions s where s.parent_session_id = $1::uuid
           and not exists (select 1 from journal_entries j where j.session_id = s.id)`,
        [parent.id],
      )
    ).rows.map((r) => String(r.id));
    turns = turnsIn(turnsFile);
    results = (
      await db.pool.query("select kind, outcome from delegation_results where parent_session_id = $1::uuid", [
        parent.id,
      ])
    ).rows;
    runs = (
      await db.pool.query("select count(*)::int n from subagent_runs where parent_session_id = $1::uuid", [
        parent.id,
      ])
    ).rows[0].n;
  }, 180_000);

  it("the next boot completes the workflow: one child per node (none left empty), no node ran twice, one summary (S004-340)", () => {
    expect(killed.signal, killed.stderr).toBe("SIGKILL");
    expect(booted.code, booted.stderr).toBe(0);
    expect(workflows.map((w) => w.status)).toEqual(["completed"]);
    expect(children).toHaveLength(4);
    // Killed between a child's insert and the journal write placing it, the boot adopts the same planned row.
    expect(empty).toEqual([]);
    const perChild = new Map<string, number>();
    for (const t of turns) perChild.set(t.sessionId, (perChild.get(t.sessionId) ?? 0) + 1);
    expect([...perChild.keys()].sort()).toEqual([...children].sort());
    expect([...perChild.values()]).toEqual([1, 1, 1, 1]);
    expect(results).toEqual([{ kind: "workflow_summary", outcome: "ok" }]);
    expect(runs).toBe(0);
  });

  it("the boot adopts the native record's generation and admission, and neither resets nor charges the dispatch budget (S004-414)", () => {
    expect(killed.signal, killed.stderr).toBe("SIGKILL");
    // The boot's run held the row's numbers (the admission the host recorded after the kill), not the journal's.
    expect(ended?.recovery).toEqual({
      workflowGeneration: afterKill.generation,
      recoveryAdmissionVersion: afterKill.recovery_admission_version + 1,
    });
    expect(afterBoot).toEqual({
      status: "completed",
      generation: afterKill.generation,
      recovery_admission_version: afterKill.recovery_admission_version + 1,
    });
    // What the killed process charged stays charged; the boot charged only nodes never reserved before.
    expect(ended?.dispatches).toBe(4);
    expect(ended?.maxDispatches).toBe(4);
    expect(afterKill.dispatches).toBeGreaterThanOrEqual(1);
  });
});

/**
 * A workflow whose node a failed once is resumed (the native generation advances to 2) by a process that
 * is SIGKILLed in the middle of a's retried turn: the turn started, nothing was answered. A third process
 * boots over it. Every turn (its process, child, task and context) is recorded as it starts; the native row,
 * the journal and a's transcript are read right after the kill and again after the boot.
 */
describe("a daemon process SIGKILLed in the middle of a resumed node's turn", () => {
  const chain = {
    version: 1,
    name: "interrupted",
    maxDispatches: 7,
    defaults: {},
    agentTypes: {},
    nodes: [
      { id: "a", task: "TASK a", dependsOn: [] },
      { id: "b", task: "TASK b", dependsOn: ["a"] },
    ],
  };
  let killedSignal: string | null;
  let bootCode: number | null;
  let turns: Turn[];
  let childA: string;
  let killedPid: number;
  let afterKill: { row: Record<string, unknown>; dispatches: number; maxDispatches: number; a: string };
  let afterBoot: { row: Record<string, unknown>; ended: Ended | undefined; status: string };
  let transcript: Array<{ role: string; customType?: string; content: unknown }>;
  let bootStdout: string;

  beforeAll(async () => {
    const repo = new PgDelegationRepository(db.pool);
    const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
    const parent = await repo.createRootSession(account.id, "scripted");
    const turnsFile = join(scratchDir("crw-wf-turn-"), "turns");
    const base = { databaseUrl: db.url, turnsFile };
    const who = { accountId: account.id, parentSessionId: parent.id };
    const failed = await runChild({
      ...base,
      failTask: "TASK a",
      start: { ...who, toolCallId: "call-start", definition: chain },
    });
    expect(failed.code, failed.stderr).toBe(0);
    const workflowId = String(
      (await db.pool.query("select id from workflows where parent_session_id = $1::uuid", [parent.id]))
        .rows[0]?.id,
    );
    const killed = await runChild({
      ...base,
      killInTurn: "TASK a",
      resume: { ...who, toolCallId: "call-resume", workflowId },
    });
    killedSignal = killed.signal;
    killedPid = killed.pid as number;
    const row = async () =>
      (
        await db.pool.query(
          "select status, generation, recovery_admission_version from workflows where id = $1::uuid",
          [workflowId],
        )
      ).rows[0] as Record<string, unknown>;
    const j = await journalOf(workflowId);
    childA = j.nodes.a?.childSessionId as string;
    afterKill = {
      row: await row(),
      dispatches: j.dispatches,
      maxDispatches: j.definition.maxDispatches,
      a: j.nodes.a?.status as string,
    };
    const booted = await runChild(base);
    bootCode = booted.code;
    bootStdout = booted.stdout;
    const out = reportOf(booted.stdout);
    afterBoot = {
      row: await row(),
      ended: out.ended?.[workflowId],
      status: String(out.outcomes?.[0]?.status),
    };
    turns = turnsIn(turnsFile);
    const { rows } = await db.pool.query(
      "select body from journal_entries where session_id = $1::uuid order by seq",
      [childA],
    );
    transcript = rows.map((r) => JSON.parse(r.body).message);
  }, 180_000);

  it("the interrupted turn resumes in its own child through the interrupted-result context (S004-330)", () => {
    expect(killedSignal).toBe("SIGKILL");
    expect(bootCode, bootStdout).toBe(0);
    expect(afterKill.a).toBe("running");
    // a's turns in order: the failed first attempt, the retry the kill interrupted, the boot's continuation.
    const a = turns.filter((t) => t.task === "TASK a");
    expect(a.map((t) => t.sessionId)).toEqual([childA, childA, childA]);
    // The retry's turn was the killed process's (its last act); the continuation is the boot's.
    expect(turns.filter((t) => t.pid === killedPid).map((t) => t.task)).toEqual(["TASK a"]);
    expect(a[1]?.pid).toBe(killedPid);
    expect(a[2]?.pid).not.toBe(killedPid);
    // The boot's turn saw the interrupted turn's context: the retried task, then the interruption note.
    expect(a[2]?.context.slice(-2)).toEqual(["user", "custom:interrupted"]);
    expect(a[1]?.context.at(-1)).toBe("user");
    // The transcript: the task, the retried task, the note, and only then an answer.
    expect(transcript.map((m) => (m.role === "custom" ? `custom:${m.customType}` : m.role))).toEqual([
      "user",
      "user",
      "custom:interrupted",
      "assistant",
    ]);
    expect(afterBoot.status).toBe("completed");
  });

  it("the boot keeps the native generation and the dispatch budget the killed run had (S004-391)", () => {
    // The resume advanced the generation to 2 before the kill; the boot neither reset nor advanced it.
    expect(afterKill.row).toEqual({ status: "running", generation: 2, recovery_admission_version: 1 });
    expect(afterBoot.row).toEqual({ status: "completed", generation: 2, recovery_admission_version: 1 });
    expect(afterBoot.ended?.recovery).toEqual({ workflowGeneration: 2, recoveryAdmissionVersion: 1 });
    // The budget: a was charged once at the start; its continuation charged nothing; only b's fresh
    // dispatch was charged after the boot. The limit stayed the definition's.
    expect(afterKill.dispatches).toBe(1);
    expect(afterBoot.ended?.dispatches).toBe(afterKill.dispatches + 1);
    expect([afterKill.maxDispatches, afterBoot.ended?.maxDispatches]).toEqual([7, 7]);
    expect(afterBoot.ended?.run).toBe(2);
  });
});
