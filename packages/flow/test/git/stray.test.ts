import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  compareHead,
  ensureWorktree,
  keepStray,
  pendingTree,
  recordExecutorHead,
  removeWorktree,
  strayHeadForTree,
  strayRef,
  worktreePath,
} from "../../src/git/index.js";
import { commitTree, moveHead } from "../../src/git/stray.js";
import { tempRepo } from "./repo.js";

let t: ReturnType<typeof tempRepo>;
beforeEach(() => {
  t = tempRepo();
});
afterEach(() => rmSync(t.root, { recursive: true, force: true }));

/** A subagent committing in its worktree, as it should not. */
function subagentCommits(dir: string, file: string, text: string): string {
  writeFileSync(join(dir, file), text);
  t.sh(dir, "add", "-A");
  t.sh(dir, "commit", "-q", "-m", `subagent: ${file}`);
  return t.sh(dir, "rev-parse", "HEAD");
}

/**
 * Puts a stand-in for git first on PATH: git as crw runs it, except that right after crw first reads `ref`,
 * another writer sets it to `to` (a writer racing crw's compare-and-swap).
 */
function raceAfterRead(ref: string, to: string): { restore: () => void; happened: () => boolean } {
  const real = execFileSync("sh", ["-c", "command -v git"], { encoding: "utf8" }).trim();
  const bin = mkdtempSync(join(t.root, "bin-"));
  const mark = join(bin, "race-once");
  writeFileSync(mark, "");
  writeFileSync(
    join(bin, "git"),
    [
      "#!/bin/sh",
      `"${real}" "$@"; code=$?`,
      `case "$*" in *"rev-parse -q --verify ${ref}^{commit}"*)`,
      `  if [ -e "${mark}" ]; then rm "${mark}"; "${real}" -C "${t.repo}" update-ref "${ref}" "${to}"; fi;;`,
      "esac",
      'exit "$code"',
      "",
    ].join("\n"),
    { mode: 0o755 },
  );
  const path = process.env.PATH;
  process.env.PATH = `${bin}:${path}`;
  return {
    restore: () => {
      process.env.PATH = path;
    },
    happened: () => !existsSync(mark),
  };
}

describe("executor worktrees", () => {
  it("a worktree per allocation, made at the allocation's start and restored, not made twice", async () => {
    const path = worktreePath(join(t.root, "workspaces"), "build node", "alloc-1");
    expect(path).toMatch(/build_node-alloc-1$/);
    const made = await ensureWorktree({ repo: t.repo, path, commit: t.start });
    expect(made).toEqual({ path, created: true, head: t.start });
    writeFileSync(join(path, "b.txt"), "pending\n");
    const again = await ensureWorktree({ repo: t.repo, path, commit: t.start });
    expect(again).toMatchObject({ created: false, head: t.start });
    // detached: no branch of the user's moved
    expect(t.sh(path, "rev-parse", "--abbrev-ref", "HEAD")).toBe("HEAD");
    expect(t.sh(t.repo, "rev-parse", "main")).toBe(t.start);
    await removeWorktree({ repo: t.repo, path });
    expect(t.sh(t.repo, "worktree", "list")).not.toContain("alloc-1");
  }, 30_000);

  it("a worktree whose making was cut short (an empty directory, or a worktree's directory gone) is made again; other files are never removed", async () => {
    const path = join(t.root, "w-crash");
    mkdirSync(path);
    expect(await ensureWorktree({ repo: t.repo, path, commit: t.start })).toMatchObject({ created: true });
    rmSync(path, { recursive: true }); // registered in the repository, its directory gone
    expect(await ensureWorktree({ repo: t.repo, path, commit: t.start })).toMatchObject({ created: true });
    const other = join(t.root, "w-other");
    mkdirSync(other);
    writeFileSync(join(other, "keep.txt"), "mine");
    await expect(ensureWorktree({ repo: t.repo, path: other, commit: t.start })).rejects.toMatchObject({
      code: "not_a_checkout",
    });
    expect(readFileSync(join(other, "keep.txt"), "utf8")).toBe("mine");
  }, 30_000);

  it("compareHead: HEAD at the expected commit, or moved from it", async () => {
    const path = join(t.root, "w1");
    await ensureWorktree({ repo: t.repo, path, commit: t.start });
    expect(await compareHead(path, t.start)).toEqual({ moved: false, head: t.start });
    const head = subagentCommits(path, "x.txt", "x\n");
    expect(await compareHead(path, t.start)).toEqual({ moved: true, start: t.start, head });
  }, 30_000);
});

describe("stray refs", () => {
  it("a moved HEAD is kept on refs/crw/flow/<run>/stray/<node>/a<attempt>-<call>, one per call and attempt, with executor_head_moved's data (S000-119)", async () => {
    const path = join(t.root, "w1");
    await ensureWorktree({ repo: t.repo, path, commit: t.start });
    const head1 = subagentCommits(path, "x.txt", "build\n");
    const build = await recordExecutorHead({
      repo: t.repo,
      worktree: path,
      expected: t.start,
      run: "run-1",
      node: "impl",
      attempt: 1,
      call: "build",
    });
    expect(build.moved).toEqual({
      start: t.start,
      head: head1,
      ref: "refs/crw/flow/run-1/stray/impl/a1-build",
    });
    expect(build.kept).toMatchObject({ kept: true, how: "created" });
    // the fix round of the same allocation keeps its own ref
    const head2 = subagentCommits(path, "y.txt", "fix\n");
    const fix = await recordExecutorHead({
      repo: t.repo,
      worktree: path,
      expected: t.start,
      run: "run-1",
      node: "impl",
      attempt: 1,
      call: "fix-1",
    });
    expect(fix.moved?.ref).toBe(strayRef("run-1", "impl", 1, "fix-1"));
    expect(t.sh(t.repo, "rev-parse", strayRef("run-1", "impl", 1, "build"))).toBe(head1);
    expect(t.sh(t.repo, "rev-parse", strayRef("run-1", "impl", 1, "fix-1"))).toBe(head2);
    // a HEAD that did not move records nothing
    const still = await recordExecutorHead({
      repo: t.repo,
      worktree: path,
      expected: head2,
      run: "run-1",
      node: "impl",
      attempt: 1,
      call: "fix-2",
    });
    expect(still).toEqual({ moved: null, kept: null });
    // the build call's next attempt on the allocation keeps its own ref; the first attempt's stays
    const head3 = subagentCommits(path, "z.txt", "again\n");
    const again = await recordExecutorHead({
      repo: t.repo,
      worktree: path,
      expected: head2,
      run: "run-1",
      node: "impl",
      attempt: 2,
      call: "build",
    });
    expect(again.moved?.ref).toBe("refs/crw/flow/run-1/stray/impl/a2-build");
    expect(t.sh(t.repo, "rev-parse", "refs/crw/flow/run-1/stray/impl/a2-build")).toBe(head3);
    expect(t.sh(t.repo, "rev-parse", "refs/crw/flow/run-1/stray/impl/a1-build")).toBe(head1);
  }, 30_000);

  it("two writers racing to create the stray ref: one creates it, the other finds it unchanged; a ref name git refuses is refused", async () => {
    const ref = strayRef("run-1", "impl", 1, "build");
    const path = join(t.root, "w1");
    await ensureWorktree({ repo: t.repo, path, commit: t.start });
    const head = subagentCommits(path, "x.txt", "x\n");
    // two writers racing to create: one creates, the other finds it and answers unchanged
    const both = await Promise.all([
      keepStray({ repo: t.repo, ref, head }),
      keepStray({ repo: t.repo, ref, head }),
    ]);
    expect(both.map((k) => (k.kept ? k.how : k.reason)).sort()).toEqual(["created", "unchanged"]);
    expect(t.sh(t.repo, "rev-parse", ref)).toBe(head);
    await expect(
      keepStray({ repo: t.repo, ref: "refs/crw/flow/run 1/stray/x/a1-y", head }),
    ).rejects.toMatchObject({
      code: "ref_invalid",
    });
  }, 30_000);

  it("a stray ref another writer creates between the read and the create is not overwritten: the create fails and the ref is read again (S000-120)", async () => {
    const ref = strayRef("run-1", "impl", 1, "build");
    const path = join(t.root, "w1");
    await ensureWorktree({ repo: t.repo, path, commit: t.start });
    const head = subagentCommits(path, "x.txt", "x\n");
    // right after crw first reads the stray ref (finding none), another writer creates it at the start
    const race = raceAfterRead(ref, t.start);
    let kept: Awaited<ReturnType<typeof keepStray>>;
    try {
      kept = await keepStray({ repo: t.repo, ref, head });
    } finally {
      race.restore();
    }
    expect(race.happened()).toBe(true);
    // the create against no ref failed; read again, the ref is moved on from the other writer's commit
    expect(kept).toMatchObject({ kept: true, how: "fast_forward", old: t.start, head });
    expect(t.sh(t.repo, "rev-parse", ref)).toBe(head);
  }, 30_000);

  it("the stray ref moves only by a fast-forward to a descendant, with the held commit as the old value (S000-121)", async () => {
    const ref = strayRef("run-1", "impl", 1, "build");
    const path = join(t.root, "w1");
    await ensureWorktree({ repo: t.repo, path, commit: t.start });
    const first = subagentCommits(path, "x.txt", "1\n");
    expect(await keepStray({ repo: t.repo, ref, head: first })).toMatchObject({ kept: true, how: "created" });
    const later = subagentCommits(path, "x.txt", "2\n");
    expect(await keepStray({ repo: t.repo, ref, head: later })).toMatchObject({
      kept: true,
      how: "fast_forward",
      old: first,
    });
    // a commit that is no descendant (the subagent reset and committed elsewhere) does not move it
    t.sh(path, "checkout", "-q", "--detach", t.start);
    const sideways = subagentCommits(path, "z.txt", "z\n");
    expect(await keepStray({ repo: t.repo, ref, head: sideways })).toEqual({
      kept: false,
      reason: "not_fast_forward",
      ref,
      head: sideways,
      current: later,
    });
    expect(t.sh(t.repo, "rev-parse", ref)).toBe(later);
    // the held commit is the old value: a ref another writer moved since crw read it is not overwritten
    t.sh(path, "checkout", "-q", "--detach", later);
    const next = subagentCommits(path, "x.txt", "3\n");
    t.sh(path, "checkout", "-q", "--detach", later);
    const other = subagentCommits(path, "y.txt", "other\n");
    const race = raceAfterRead(ref, other);
    let raced: Awaited<ReturnType<typeof keepStray>>;
    try {
      raced = await keepStray({ repo: t.repo, ref, head: next });
    } finally {
      race.restore();
    }
    expect(race.happened()).toBe(true);
    expect(raced).toMatchObject({ kept: false, reason: "not_fast_forward", current: other });
    expect(t.sh(t.repo, "rev-parse", ref)).toBe(other);
  }, 30_000);

  it("crw's commit of the pending tree on start moves HEAD only from the observed HEAD; the proof finds the stray HEAD of that tree", async () => {
    const path = join(t.root, "w1");
    await ensureWorktree({ repo: t.repo, path, commit: t.start });
    const stray = subagentCommits(path, "x.txt", "work\n");
    const tree = await pendingTree(path);
    const commit = await commitTree(path, tree, t.start, "crw.commit impl");
    // a stale observed HEAD is refused: HEAD moved since it was read
    await expect(moveHead(path, commit, t.start)).rejects.toMatchObject({ code: "head_moved" });
    expect(t.sh(path, "rev-parse", "HEAD")).toBe(stray);
    await moveHead(path, commit, stray);
    const done = { tree, commit };
    expect(done.tree).toBe(tree);
    expect(t.sh(path, "rev-parse", "HEAD")).toBe(done.commit);
    expect(t.sh(path, "rev-parse", "HEAD^")).toBe(t.start); // on start, not on the stray commit
    expect(t.sh(path, "log", "-1", "--format=%an %s")).toBe("crw flow crw.commit impl");
    expect(t.sh(path, "status", "--porcelain")).toBe("");
    expect(await strayHeadForTree(t.repo, [t.start, stray], done.tree)).toBe(stray);
    expect(await strayHeadForTree(t.repo, [t.start], done.tree)).toBeNull();
  }, 30_000);

  it("the pending tree holds untracked and deleted files without touching the worktree's index", async () => {
    const path = join(t.root, "w1");
    await ensureWorktree({ repo: t.repo, path, commit: t.start });
    writeFileSync(join(path, "new.txt"), "n\n");
    rmSync(join(path, "a.txt"));
    const before = t.sh(path, "status", "--porcelain");
    const tree = await pendingTree(path);
    expect(t.sh(path, "ls-tree", "--name-only", tree)).toBe("new.txt");
    expect(t.sh(path, "status", "--porcelain")).toBe(before);
  }, 30_000);
});
