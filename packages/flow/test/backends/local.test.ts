import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { scratchDir } from "@crw/tools/scratch";
import { beforeAll, describe, expect, it } from "vitest";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow } from "../../src/journal/rows.js";
import { crwFlow, ensureBuilt, repoRoot, waitFor } from "../helpers/cli.js";

const demo = join(repoRoot, "examples/flow/release-notes.workflow.mjs");
const script = join(repoRoot, "examples/flow/release-notes.script.json");

const git = (cwd: string, ...args: string[]) =>
  execFileSync("git", args, { cwd, encoding: "utf8", env: { ...process.env, ...gitIdentity } }).trim();
const gitIdentity = {
  GIT_AUTHOR_NAME: "t",
  GIT_AUTHOR_EMAIL: "t@t",
  GIT_COMMITTER_NAME: "t",
  GIT_COMMITTER_EMAIL: "t@t",
};

/** A user's repository with one commit on main. */
function sampleRepo(dir: string): string {
  const repo = join(dir, "repo");
  mkdirSync(repo);
  git(repo, "init", "-q", "-b", "main");
  writeFileSync(join(repo, "README.md"), "# sample\n");
  git(repo, "add", "-A");
  git(repo, "commit", "-q", "-m", "first");
  return repo;
}

/** A plain terminal: no Codex thread, no account. */
function plainEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.CODEX_THREAD_ID;
  delete env.OPENAI_API_KEY;
  delete env.CRW_FLOW_FAULT;
  return { ...env, ...extra };
}

function rowsOf(state: string, run: string): JournalRow[] {
  return readJournalFile(join(state, "flow", run, "journal.jsonl")).rows;
}

async function ended(state: string, run: string): Promise<JournalRow> {
  return waitFor(
    `run ${run} to end`,
    () =>
      existsSync(join(state, "flow", run, "journal.jsonl")) &&
      rowsOf(state, run).find((r) => r.type === "run_ended"),
    60_000,
  );
}

const expected = {
  title: "Version 1.2.0",
  sections: ["Features", "Fixes"],
  file: "NOTES.md",
  verdict: "approve",
};

beforeAll(() => ensureBuilt(), 180_000);

describe.concurrent("the local backend through the built CLI", () => {
  it("the demo workflow runs offline from a plain terminal: local is the default without an owner thread; show and shadow read it", async () => {
    const state = scratchDir("crw-flow-local-");
    const repo = sampleRepo(state);
    const start = await crwFlow(
      [
        "start",
        demo,
        "--repo",
        repo,
        "--state",
        state,
        "--run",
        "demo",
        "--script",
        script,
        "--input",
        '{"version":"1.2.0"}',
        "--json",
      ],
      plainEnv(),
    );
    expect(start.code, start.stderr).toBe(0);
    expect(start.json()).toMatchObject({ run_id: "demo", backend: "local", model: "scripted", owner: null });
    // a local run has no owner steps: the answer names no next command, only the show that follows it
    expect(start.json().next).toBeNull();
    expect(String(start.json().show)).toMatch(/ flow show demo --state /);
    const end = await ended(state, "demo");
    expect(end).toMatchObject({ type: "run_ended", status: "completed", result: expected });
    const rows = rowsOf(state, "demo");
    expect(rows.find((r) => r.type === "started")).toMatchObject({ backend: "local", process_n: 1 });
    const prepared = rows.filter((r) => r.type === "prepared");
    expect(prepared.map((r) => r.call).sort()).toEqual([
      "draft.1",
      "draft.2",
      "plan.1",
      "review.1",
      "write.1",
    ]);
    for (const p of prepared) expect(p).toMatchObject({ backend: "local" });
    // the same rows a session call reads: thread_started + turn_started before the turn, then completed
    for (const t of rows.filter((r) => r.type === "thread_started")) {
      expect(t).toMatchObject({ via: "local", model: "scripted", attempt: 1, parent_thread_id: null });
    }
    const completed = rows.filter((r) => r.type === "completed");
    expect(completed).toHaveLength(5);
    for (const c of completed) if (c.type === "completed") expect(c.tokens.total ?? 0).toBeGreaterThan(0);
    // the parallel pair: both drafts were prepared before either completed
    const seqOf = (type: string, call: string) =>
      rows.find((r) => r.type === type && "call" in r && r.call === call)?.seq ?? -1;
    expect(seqOf("prepared", "draft.2")).toBeLessThan(seqOf("completed", "draft.1"));
    // draft.2's first answer is prose: one repair turn on the same conversation, then completed at k 2
    const draft2 = rows.filter((r) => "call" in r && r.call === "draft.2");
    expect(
      draft2
        .filter((r) => r.type === "turn_started")
        .map((r) => r.type === "turn_started" && r.conversation_turn),
    ).toEqual([1, 2]);
    expect(draft2.find((r) => r.type === "completed")).toMatchObject({ k: 2, attempt: 1, extracted: true });
    // the executor's tool really wrote the file in its worktree, and crw committed it onto the run's branch
    const work = completed.find((c) => c.type === "completed" && c.call === "write.1");
    const commit = work?.type === "completed" ? work.work?.commit : null;
    expect(commit).toMatch(/^[0-9a-f]{40}$/);
    expect(git(repo, "rev-parse", "crw/flow/demo")).toBe(commit);
    expect(git(repo, "show", "crw/flow/demo:NOTES.md")).toContain(
      "## Fixes\n- Torn journal lines are cut off",
    );
    // the reviewer that followed started from that commit and had NOTES.md in its checkout
    const review = prepared.find((p) => p.type === "prepared" && p.call === "review.1");
    expect(review?.type === "prepared" && review.allocation).toMatchObject({
      kind: "worktree",
      start: commit,
    });
    const reviewDir = review?.type === "prepared" ? review.allocation.workspace : "";
    expect(readFileSync(join(reviewDir, "NOTES.md"), "utf8")).toContain("## Fixes");
    const show = await crwFlow(["show", "demo", "--state", state], plainEnv());
    expect(show.code).toBe(0);
    expect(show.stdout).toMatch(/draft\.2\s+explorer\s+completed\s+attempts 1/);
    const shadow = await crwFlow(["shadow", "demo", "--state", state, "--json"], plainEnv());
    expect(shadow.code, shadow.stderr).toBe(0);
    expect(shadow.json()).toMatchObject({
      backend: "local",
      recorded: "completed",
      replay: "completed",
      divergences: [],
    });
    // another version of the workflow, shadowed against the same journal: exit 1 naming the op
    const changed = join(state, "changed.workflow.mjs");
    writeFileSync(changed, readFileSync(demo, "utf8").replace("Plan the release notes", "Plan the notes"));
    const diverged = await crwFlow(
      ["shadow", "demo", "--state", state, "--workflow", changed, "--json"],
      plainEnv(),
    );
    expect(diverged.code).toBe(1);
    expect(diverged.json()).toMatchObject({
      backend: "local",
      replay: "incomplete",
      divergences: [{ kind: "input_digest_differs", op: "plan.1" }],
    });
  }, 90_000);

  it("a local run killed right after a turn_started: a resume on the session backend is refused before any row; the local resume runs the lost attempt again, its turns replace the lost ones, same result", async () => {
    const state = scratchDir("crw-flow-local-crash-");
    const start = await crwFlow(
      [
        "start",
        demo,
        "--backend",
        "local",
        "--state",
        state,
        "--run",
        "crash",
        "--script",
        script,
        "--input",
        '{"version":"1.2.0"}',
        "--json",
      ],
      plainEnv({ CRW_FLOW_FAULT: "after:turn_started:4" }),
    );
    expect(start.code, start.stderr).toBe(0);
    const dir = join(state, "flow", "crash");
    const pid = Number(start.json().pid);
    const alive = () => {
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    };
    await waitFor("the run process to die", () => !alive(), 30_000);
    const before = rowsOf(state, "crash");
    expect(before.some((r) => r.type === "run_ended")).toBe(false);
    const lostTurn = before.filter((r) => r.type === "turn_started")[3];
    if (lostTurn?.type !== "turn_started") throw new Error("no fourth turn_started");
    // a resume on the other backend is refused before any row is written
    const specPath = join(dir, "run.json");
    const specText = readFileSync(specPath, "utf8");
    writeFileSync(
      specPath,
      JSON.stringify({ ...JSON.parse(specText), backend: "session", owner: "thread-x" }),
    );
    const journalText = readFileSync(join(dir, "journal.jsonl"), "utf8");
    const mixed = await crwFlow(["resume", "crash", "--state", state], plainEnv());
    expect(mixed.code).toBe(2);
    expect(mixed.stderr).toMatch(/local backend/);
    expect(readFileSync(join(dir, "journal.jsonl"), "utf8")).toBe(journalText);
    writeFileSync(specPath, specText);
    const resume = await crwFlow(["resume", "crash", "--state", state], plainEnv());
    expect(resume.code, resume.stderr).toBe(0);
    const rows = rowsOf(state, "crash");
    expect(rows.find((r) => r.type === "run_ended")).toMatchObject({ status: "completed", result: expected });
    expect(rows.filter((r) => r.type === "started").map((r) => r.type === "started" && r.backend)).toEqual([
      "local",
      "local",
    ]);
    const own = rows.filter((r) => "call" in r && r.call === lostTurn.call);
    expect(own.find((r) => r.type === "flow_warning")).toMatchObject({
      warning: "local_attempt_lost",
      detail: { attempt: 1 },
    });
    const again = own.filter((r) => r.type === "turn_started" && r.attempt === 2);
    expect(again[0]).toMatchObject({ conversation_turn: 1, replaces_turn: 1, k: lostTurn.k + 1 });
    expect(own.filter((r) => r.type === "completed")).toHaveLength(1);
    expect(rows.filter((r) => r.type === "completed")).toHaveLength(5);
  }, 90_000);

  it("bad local options are input errors before anything is written", async () => {
    const state = scratchDir("crw-flow-local-bad-");
    const bad = join(state, "bad.json");
    writeFileSync(bad, "{ not json");
    const cases: string[][] = [
      ["--model", "gpt-nothing"],
      ["--script", bad],
      ["--script", join(state, "missing.json")],
      ["--backend", "session", "--owner", "t-1", "--script", script],
      ["--backend", "elsewhere"],
    ];
    for (const extra of cases) {
      const r = await crwFlow(["start", demo, "--state", state, "--json", ...extra], plainEnv());
      expect(r.code, `${extra.join(" ")}: ${r.stderr}`).toBe(2);
      expect(r.json()).toMatchObject({ error: { code: "input" } });
    }
    mkdirSync(join(state, "flow"), { recursive: true });
    expect(readdirSync(join(state, "flow"))).toEqual([]);
  }, 60_000);
});
