import { spawn, spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { PgDelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import { WORKFLOW_FAULT_POINTS } from "../src/index.js";

const db = useTestDatabase();
const root = resolve(import.meta.dirname, "../../..");
const child = resolve(import.meta.dirname, "fixtures/workflow-child.mjs");

function newest(dir: string): number {
  let n = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    n = Math.max(n, e.isDirectory() ? newest(p) : statSync(p).mtimeMs);
  }
  return n;
}

/** The child runs built code: build a package whose dist is missing or older than its sources. */
function ensureBuilt(dir: string): void {
  const built = join(root, dir, "dist", "index.js");
  if (existsSync(built) && statSync(built).mtimeMs >= newest(join(root, dir, "src"))) return;
  const r = spawnSync("npx", ["tsup"], { cwd: join(root, dir), stdio: "pipe", encoding: "utf8" });
  if (r.status !== 0) throw new Error(`build of ${dir} failed: ${r.stderr}`);
}

function runChild(
  config: unknown,
  fault?: string,
): Promise<{ code: number | null; signal: string | null; stdout: string; stderr: string }> {
  return new Promise((done, fail) => {
    const env: NodeJS.ProcessEnv = { ...process.env, CRW_WORKFLOW_CHILD: JSON.stringify(config) };
    delete env.NODE_OPTIONS;
    delete env.CRW_WORKFLOW_FAULT;
    if (fault) env.CRW_WORKFLOW_FAULT = fault;
    const p = spawn(process.execPath, [child], { env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d) => (stdout += String(d)));
    p.stderr.on("data", (d) => (stderr += String(d)));
    const timer = setTimeout(() => p.kill("SIGKILL"), 60_000);
    p.on("error", fail);
    p.on("exit", (code, signal) => {
      clearTimeout(timer);
      done({ code, signal, stdout, stderr });
    });
  });
}

const definition = {
  version: 1,
  name: "crashy",
  defaults: {},
  agentTypes: {},
  nodes: [
    { id: "a", task: "TASK a", dependsOn: [] },
    { id: "b", task: "TASK b", dependsOn: ["a"] },
    { id: "c", task: "TASK c", dependsOn: ["a"] },
    { id: "d", task: "TASK d", dependsOn: ["b", "c"] },
  ],
};

beforeAll(() => {
  for (const dir of ["packages/db", "packages/brain", "packages/subagent", "plugins/subagent"])
    ensureBuilt(dir);
}, 120_000);

describe("a daemon process SIGKILLed while a workflow runs", () => {
  it.each(WORKFLOW_FAULT_POINTS)(
    "S004-340: S004-414: killed at %s, the next boot completes the workflow: one child per node (none left empty), no node ran twice, one summary",
    async (fault) => {
      const repo = new PgDelegationRepository(db.pool);
      const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
      const parent = await repo.createRootSession(account.id, "scripted");
      const effectsFile = join(await mkdtemp(join(tmpdir(), "crw-wf-crash-")), "effects");
      const base = { databaseUrl: db.url, effectsFile };
      const killed = await runChild(
        {
          ...base,
          start: {
            accountId: account.id,
            parentSessionId: parent.id,
            toolCallId: `call-${fault}`,
            definition,
          },
        },
        fault,
      );
      expect(killed.signal, killed.stderr).toBe("SIGKILL");
      const booted = await runChild(base);
      expect(booted.code, booted.stderr).toBe(0);
      const { rows: wf } = await db.pool.query(
        "select id, status from workflows where parent_session_id = $1::uuid",
        [parent.id],
      );
      expect(wf).toEqual([{ id: wf[0].id, status: "completed" }]);
      const { rows: children } = await db.pool.query(
        "select id from sessions where parent_session_id = $1::uuid",
        [parent.id],
      );
      expect(children).toHaveLength(4);
      // No empty child is left behind (killed between a child's insert and the journal write placing it,
      // the boot adopts the same planned row).
      const { rows: empty } = await db.pool.query(
        `select s.id from sessions s where s.parent_session_id = $1::uuid
           and not exists (select 1 from journal_entries j where j.session_id = s.id)`,
        [parent.id],
      );
      expect(empty).toEqual([]);
      const effects = existsSync(effectsFile) ? readFileSync(effectsFile, "utf8").trim().split("\n") : [];
      const perChild = new Map<string, number>();
      for (const line of effects) perChild.set(line, (perChild.get(line) ?? 0) + 1);
      expect([...perChild.values()]).toEqual([1, 1, 1, 1]);
      const { rows: results } = await db.pool.query(
        "select kind, outcome from delegation_results where parent_session_id = $1::uuid",
        [parent.id],
      );
      expect(results).toEqual([{ kind: "workflow_summary", outcome: "ok" }]);
      const { rows: runs } = await db.pool.query(
        "select count(*)::int n from subagent_runs where parent_session_id = $1::uuid",
        [parent.id],
      );
      expect(runs[0].n).toBe(0);
    },
    120_000,
  );
});
