import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow, RowOf } from "../../src/journal/rows.js";
import { ownStart, pidAlive } from "../../src/util/liveness.js";
import { crwFlow, ensureBuilt, waitFor } from "../helpers/cli.js";
import { tempRepo } from "./repo.js";

/**
 * crw's commit of an executor's work and the HEAD it compares, on a run process of its own (the local
 * backend, a scripted model): after a death between crw's commit and its completed row, and with a HEAD
 * that moves between crw's look at it and its compare-and-swap.
 */
const done = { type: "object", required: ["ok"], properties: { ok: { type: "boolean" } } };
const workflow = `
export default {
  name: "commit-head",
  async run(ctx) {
    return ctx.call({ role: "executor", node: "notes", task: "write notes", schema: ${JSON.stringify(done)} });
  },
};
`;
const script = {
  calls: {
    "notes.1": [
      { toolCalls: [{ name: "write", arguments: { path: "NOTES.md", content: "# notes\n" } }] },
      { text: '{"ok":true}' },
    ],
  },
};

function setUp(name: string) {
  const t = tempRepo(`crw-flow-${name}-`);
  const wf = join(t.root, "wf.mjs");
  writeFileSync(wf, workflow);
  const scriptFile = join(t.root, "script.json");
  writeFileSync(scriptFile, JSON.stringify(script));
  const state = join(t.root, "state");
  const journal = join(state, "flow", name, "journal.jsonl");
  const rows = (): JournalRow[] => (existsSync(journal) ? readJournalFile(journal).rows : []);
  const env = { ...process.env };
  delete env.CODEX_THREAD_ID;
  delete env.CRW_FLOW_FAULT;
  const start = (extra: NodeJS.ProcessEnv) =>
    crwFlow(
      ["start", wf, "--repo", t.repo, "--state", state, "--run", name, "--script", scriptFile, "--json"],
      { ...env, ...extra },
    );
  return { ...t, state, rows, env, start };
}

const ofType = <T extends JournalRow["type"]>(rows: JournalRow[], type: T) =>
  rows.filter((r): r is RowOf<T> => r.type === type);

beforeAll(() => ensureBuilt(), 120_000);

describe("crw's commit of an executor's work and the HEAD it compares", () => {
  it("a call whose process died after crw moved HEAD to its commit is compared, on resume, with that commit, not the allocation's start: no stray commit is reported (S000-118)", async () => {
    const r = setUp("died-after-move");
    const started = await r.start({ CRW_FLOW_FAULT: "after:commit_intended:1" });
    expect(started.code, started.stderr).toBe(0);
    const pid = Number(started.json().pid);
    await waitFor("the run process to die at its fault point", () => !pidAlive(pid), 60_000);
    const [intent] = ofType(r.rows(), "commit_intended");
    if (!intent) throw new Error("no commit intent before the fault point");
    expect(ofType(r.rows(), "completed")).toHaveLength(0);
    // The disk as a death right after crw's compare-and-swap leaves it: HEAD at crw's commit, no completed row.
    const prepared = ofType(r.rows(), "prepared").find((p) => p.call === "notes.1");
    const worktree = String(prepared?.allocation.workspace);
    const start = String(prepared?.allocation.start);
    expect(r.sh(worktree, "rev-parse", "HEAD")).toBe(start);
    r.sh(worktree, "update-ref", "--no-deref", "HEAD", intent.commit, start);
    r.sh(worktree, "read-tree", intent.commit);

    const resumed = await crwFlow(["resume", "died-after-move", "--state", r.state, "--json"], r.env);
    expect(resumed.code, resumed.stderr).toBe(0);
    await waitFor("the resumed run to end", () => r.rows().some((x) => x.type === "run_ended"), 60_000);
    const [completed] = ofType(r.rows(), "completed");
    expect(completed?.work?.commit).toBe(intent.commit);
    expect(completed?.executor_head_moved).toBeUndefined();
    expect(r.sh(r.repo, "for-each-ref", "refs/crw/flow/died-after-move/stray")).toBe("");
    expect(ofType(r.rows(), "commit_intended")).toHaveLength(1);
  }, 120_000);

  it("crw's commit moves HEAD only from the HEAD it observed: a commit made in between is not overwritten (S000-123)", async () => {
    const r = setUp("moved-in-between");
    // A git in front of the real one: right before crw's compare-and-swap of HEAD, a commit lands in the
    // worktree (as a subagent still running there would make one).
    const bin = join(r.root, "bin");
    mkdirSync(bin);
    const stand = join(bin, "git");
    writeFileSync(
      stand,
      `#!/bin/sh
case " $* " in *" update-ref "*" crw.commit "*)
  GIT_AUTHOR_NAME=late GIT_AUTHOR_EMAIL=l@l GIT_COMMITTER_NAME=late GIT_COMMITTER_EMAIL=l@l \\
    /usr/bin/git commit -q --allow-empty -m "late commit" >/dev/null 2>&1
  /usr/bin/git rev-parse HEAD > "${join(r.root, "late")}" ;;
esac
exec /usr/bin/git "$@"
`,
    );
    chmodSync(stand, 0o755);
    const started = await r.start({ PATH: `${bin}:${process.env.PATH}` });
    expect(started.code, started.stderr).toBe(0);
    const pid = Number(started.json().pid);
    await waitFor("the run process to end", () => !pidAlive(pid), 60_000);
    const late = existsSync(join(r.root, "late")) ? readFileSync(join(r.root, "late"), "utf8").trim() : "";
    expect(late).toMatch(/^[0-9a-f]{40}$/);
    const [intent] = ofType(r.rows(), "commit_intended");
    const prepared = ofType(r.rows(), "prepared").find((p) => p.call === "notes.1");
    const worktree = String(prepared?.allocation.workspace);
    // the compare-and-swap failed: HEAD is still the commit made in between, crw's commit went nowhere
    expect(intent?.observed_head).toBe(prepared?.allocation.start);
    // crw's commit is the pending tree (the subagent's NOTES.md) on the call's start
    expect(intent?.parent).toBe(prepared?.allocation.start);
    expect(r.sh(worktree, "ls-tree", "--name-only", String(intent?.commit))).toBe("NOTES.md\na.txt");
    expect(r.sh(worktree, "rev-parse", "HEAD")).toBe(late);
    expect(ofType(r.rows(), "completed")).toHaveLength(0);
    // and the run says why it stopped, naming the worktree whose HEAD moved
    expect(r.rows().at(-1)).toMatchObject({
      type: "run_ended",
      status: "failed",
      error: `HEAD of ${worktree} is no longer ${intent?.observed_head}`,
    });
  }, 120_000);

  it("a private index left in TMPDIR by a run process killed while it read the pending tree is removed by the process that resumes", async () => {
    const r = setUp("killed-in-index");
    const tmp = join(r.root, "tmp");
    mkdirSync(tmp);
    // A git in front of the real one that, the first time it stages into a private index, says so and hangs.
    const bin = join(r.root, "bin");
    mkdirSync(bin);
    const hung = join(r.root, "hung");
    writeFileSync(
      join(bin, "git"),
      `#!/bin/sh
case " $* " in *" add -A . "*)
  if [ -n "$GIT_INDEX_FILE" ] && [ ! -e "${hung}" ]; then
    echo "$$ $GIT_INDEX_FILE" > "${hung}"; exec sleep 600
  fi;;
esac
exec /usr/bin/git "$@"
`,
    );
    chmodSync(join(bin, "git"), 0o755);
    const env = { PATH: `${bin}:${process.env.PATH}`, TMPDIR: tmp };
    const started = await r.start(env);
    expect(started.code, started.stderr).toBe(0);
    const pid = Number(started.json().pid);
    await waitFor("crw's git to stage into its private index", () => existsSync(hung), 60_000);
    const [git = "", index = ""] = readFileSync(hung, "utf8").trim().split(" ");
    const held = dirname(index);
    expect(dirname(held)).toBe(tmp);
    expect(existsSync(held)).toBe(true);
    process.kill(pid, "SIGKILL");
    await waitFor("the run process to die", () => !pidAlive(pid), 10_000);
    process.kill(Number(git), "SIGKILL");
    // A name that says no process, and a live process's own, stay.
    const foreign = join(tmp, "crw-index-abcdef");
    const live = join(tmp, `crw-index-${process.pid}-${ownStart()}-xyz`);
    mkdirSync(foreign);
    mkdirSync(live);
    expect(existsSync(held)).toBe(true);

    const resumed = await crwFlow(["resume", "killed-in-index", "--state", r.state, "--json"], {
      ...r.env,
      ...env,
    });
    expect(resumed.code, resumed.stderr).toBe(0);
    await waitFor("the resumed run to end", () => r.rows().some((x) => x.type === "run_ended"), 60_000);
    expect(ofType(r.rows(), "completed").map((c) => c.call)).toEqual(["notes.1"]);
    expect(existsSync(held)).toBe(false);
    expect(existsSync(foreign)).toBe(true);
    expect(existsSync(live)).toBe(true);
  }, 120_000);
});
