import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FakeAppServer } from "@crw/tools/codex";
import { afterEach, describe, expect, it } from "vitest";
import { noteHostNotification } from "../../src/backends/appServerTokens.js";
import { createAppServerHost, defineWorkflow, executeRun } from "../../src/index.js";
import { readJournalFile } from "../../src/journal/journal.js";
import { runPaths } from "../../src/run/paths.js";
import { type RunSpec, SPEC_FORMAT, writeSpec } from "../../src/run/spec.js";

const cleanups: Array<() => Promise<void>> = [];
let runs = 0;
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

const workflow = defineWorkflow({
  name: "tokens",
  async run(ctx) {
    return ctx.call({
      role: "architect",
      task: "answer",
      schema: { type: "object", required: ["ok"], properties: { ok: { type: "boolean" } } },
    });
  },
});

/**
 * An app-server run against the fake app-server whose rollouts are gone as soon as a turn ends: the only
 * token source left is thread/tokenUsage/updated.
 */
async function runWithoutRollouts(
  feedNotifications: boolean,
  onTurn?: (fake: FakeAppServer, threadId: string, n: number) => boolean,
) {
  const root = mkdtempSync(join(tmpdir(), "crw-flow-as-tokens-"));
  const fake = await FakeAppServer.start();
  const host = createAppServerHost({
    transport: fake.url,
    onEvent: (e) => {
      if (feedNotifications && e.type === "notification") noteHostNotification(e.notification);
    },
  });
  cleanups.push(async () => {
    await host.close();
    await fake.stop();
    rmSync(root, { recursive: true, force: true });
  });
  let turns = 0;
  fake.onTurnStart((threadId) => {
    turns++;
    const n = turns;
    setTimeout(async () => {
      if (onTurn?.(fake, threadId, n)) return;
      const t = await host.readThread(threadId);
      fake.answer(threadId, '{"ok": true}', {
        input: 900,
        cached_input: 300,
        output: 60,
        reasoning_output: 20,
      });
      if (t.ok && t.value.rolloutPath) rmSync(t.value.rolloutPath, { force: true });
    }, 20);
  });
  const paths = runPaths(join(root, "state"), `r${++runs}`);
  mkdirSync(paths.dir, { recursive: true });
  const repo = join(root, "repo");
  mkdirSync(repo);
  const spec: RunSpec = {
    format: SPEC_FORMAT,
    run_id: paths.runId,
    workflow: join(root, "inline.mjs"),
    workflow_name: "tokens",
    input: null,
    backend: "app-server",
    owner: null,
    pool: 2,
    repo,
    host: fake.url,
    created_at: new Date().toISOString(),
    env: { TMPDIR: tmpdir() },
    poll_ms: 20,
    lost_after_ms: 400,
  };
  writeSpec(paths.spec, spec);
  const outcome = await executeRun({ paths, spec, host, processToken: null, workflow });
  return { outcome, rows: readJournalFile(paths.journal).rows, fake };
}

describe("app-server backend tokens", () => {
  it("a run on the App Server records backend app-server in its started row (S000-005)", async () => {
    const { outcome, rows } = await runWithoutRollouts(true);
    expect(outcome).toEqual({ state: "completed", result: { ok: true } });
    expect(rows.filter((r) => r.type === "started")).toEqual([
      expect.objectContaining({ backend: "app-server" }),
    ]);
  });

  it("the completed row records the token parts of thread/tokenUsage/updated (S000-099)", async () => {
    const { outcome, rows, fake } = await runWithoutRollouts(true);
    expect(outcome).toEqual({ state: "completed", result: { ok: true } });
    expect(fake.requests.some((r) => r.method === "thread/start")).toBe(true);
    expect(rows.some((r) => r.type === "tokens_unmeasured")).toBe(false);
    expect(rows.find((r) => r.type === "completed")).toMatchObject({
      tokens: { input: 900, cached_input: 300, output: 60, reasoning_output: 20, total: 960 },
    });
  });

  it("without the notifications and without a rollout the turn is unmeasured (tokens_unmeasured, pauses: false)", async () => {
    const { outcome, rows } = await runWithoutRollouts(false);
    expect(outcome.state).toBe("completed");
    expect(rows.find((r) => r.type === "tokens_unmeasured")).toMatchObject({ pauses: false });
    expect(rows.find((r) => r.type === "completed")).toMatchObject({ tokens: {} });
  });

  it("a turn interrupted without an error (the server went away) loses the attempt after LostAfter; the next opens a new thread", async () => {
    const { outcome, rows, fake } = await runWithoutRollouts(true, (f, threadId, n) => {
      if (n !== 1) return false;
      f.interruptTurn(threadId);
      return true;
    });
    expect(outcome).toEqual({ state: "completed", result: { ok: true } });
    expect(rows.find((r) => r.type === "session_attempt_lost")).toMatchObject({
      attempt: 1,
      reason: "turn_interrupted",
      turn_status: "interrupted",
    });
    const threads = rows.filter((r) => r.type === "thread_started");
    expect(threads.map((r) => r.type === "thread_started" && r.attempt)).toEqual([1, 2]);
    expect(fake.requests.filter((r) => r.method === "thread/start")).toHaveLength(2);
    expect(rows.find((r) => r.type === "completed")).toMatchObject({ attempt: 2 });
  });
});
