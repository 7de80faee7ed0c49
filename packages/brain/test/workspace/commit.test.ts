import { existsSync, mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import {
  commitLeftovers,
  createIsolatedWorktree,
  diffStat,
  removeIsolatedWorktree,
} from "../../src/workspace/index.js";
import { makeRepo, refusal, sh, write } from "./helpers.js";

let fixture: ReturnType<typeof makeRepo>;
afterEach(() => fixture?.cleanup());

async function childWorktree(branch = "crw/w1") {
  fixture = makeRepo({
    "keep.txt": "keep\n",
    "change.txt": "old\n",
    "gone.txt": "bye\n",
    ".gitignore": "*.log\n",
  });
  return createIsolatedWorktree({
    repoDir: fixture.repo,
    worktreesDir: fixture.worktrees,
    branch,
    from: { head: true },
  });
}

describe("commitLeftovers", () => {
  it("commits new, changed and deleted files once, with crw's identity, leaving ignored files out", async () => {
    const wt = await childWorktree();
    write(wt.path, { "new/file.txt": "new\n", "change.txt": "new\n", "debug.log": "noise\n" });
    rmSync(join(wt.path, "gone.txt"));
    const first = await commitLeftovers({ worktree: wt, message: "crw: leftovers of call 1" });
    expect(first.committed).toBe(true);
    expect(first.changedPaths).toEqual(["change.txt", "gone.txt", "new/file.txt"]);
    expect(first.commit).toBe(sh(fixture.repo, "rev-parse", "refs/heads/crw/w1"));
    expect(sh(fixture.repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>|%s|%P", first.commit)).toBe(
      `crw <crw@localhost>|crw <crw@localhost>|crw: leftovers of call 1|${wt.baseCommit}`,
    );
    expect(sh(fixture.repo, "ls-tree", "-r", "--name-only", first.commit).split("\n")).toEqual([
      ".gitignore",
      "change.txt",
      "keep.txt",
      "new/file.txt",
    ]);
    // the worktree reads clean: its index is the commit
    expect(sh(wt.path, "status", "--porcelain")).toBe("");

    const second = await commitLeftovers({ worktree: wt, message: "crw: leftovers of call 1" });
    expect(second).toEqual({ commit: first.commit, changedPaths: [], committed: false });
    expect(sh(fixture.repo, "rev-list", "--count", `${wt.baseCommit}..crw/w1`)).toBe("1");

    const stat = await diffStat(fixture.repo, wt.baseCommit, first.commit);
    expect(stat.files).toEqual([
      { path: "change.txt", status: "modified", insertions: 1, deletions: 1 },
      { path: "gone.txt", status: "deleted", insertions: 0, deletions: 1 },
      { path: "new/file.txt", status: "added", insertions: 1, deletions: 0 },
    ]);
    expect(stat.summary).toBe("3 files changed, 2 insertions(+), 2 deletions(-)");
  });

  it("with nothing left, makes no commit", async () => {
    const wt = await childWorktree();
    const r = await commitLeftovers({ worktree: wt, message: "nothing" });
    expect(r).toEqual({ commit: wt.baseCommit, changedPaths: [], committed: false });
  });

  it("refuses a worktree whose HEAD left its branch", async () => {
    const wt = await childWorktree();
    sh(wt.path, "checkout", "-q", "--detach");
    write(wt.path, { "x.txt": "x\n" });
    const e = await refusal(commitLeftovers({ worktree: wt, message: "m" }));
    expect(e.code).toBe("worktree_off_branch");
    expect(sh(fixture.repo, "rev-parse", "refs/heads/crw/w1")).toBe(wt.baseCommit);
  });
});

describe("removeIsolatedWorktree", () => {
  it("removes the worktree and keeps the branch; a second call is a no-op", async () => {
    const wt = await childWorktree();
    write(wt.path, { "a.txt": "a\n" });
    const { commit } = await commitLeftovers({ worktree: wt, message: "m" });
    expect(await removeIsolatedWorktree({ path: wt.path })).toEqual({ removed: true });
    expect(existsSync(wt.path)).toBe(false);
    expect(sh(fixture.repo, "worktree", "list", "--porcelain")).not.toContain(wt.path);
    expect(sh(fixture.repo, "rev-parse", "refs/heads/crw/w1")).toBe(commit);
    expect(await removeIsolatedWorktree({ path: wt.path })).toEqual({ removed: false });
  });

  it("refuses to drop uncommitted work unless forced", async () => {
    const wt = await childWorktree();
    write(wt.path, { "unsaved.txt": "work\n" });
    const e = await refusal(removeIsolatedWorktree({ path: wt.path }));
    expect(e.code).toBe("worktree_dirty");
    expect(e.context.paths).toEqual(["unsaved.txt"]);
    expect(existsSync(join(wt.path, "unsaved.txt"))).toBe(true);
    expect(await removeIsolatedWorktree({ path: wt.path, force: true })).toEqual({ removed: true });
    expect(existsSync(wt.path)).toBe(false);
  });
});

describe("typed failures", () => {
  it("a directory outside any repository is not_a_repository, a missing one too", async () => {
    fixture = makeRepo();
    const outside = join(fixture.root, "plain");
    mkdirSync(outside);
    const options = { worktreesDir: fixture.worktrees, branch: "crw/n1", from: { head: true } } as const;
    // GIT_CEILING_DIRECTORIES keeps git from finding a repository above the temp dir
    process.env.GIT_CEILING_DIRECTORIES = fixture.root;
    try {
      expect((await refusal(createIsolatedWorktree({ ...options, repoDir: outside }))).code).toBe(
        "not_a_repository",
      );
      expect((await refusal(createIsolatedWorktree({ ...options, repoDir: join(outside, "no") }))).code).toBe(
        "not_a_repository",
      );
    } finally {
      delete process.env.GIT_CEILING_DIRECTORIES;
    }
  });

  it("git that cannot be started is git_unavailable, not an unhandled error", async () => {
    fixture = makeRepo();
    const path = process.env.PATH;
    process.env.PATH = join(fixture.root, "no-bin");
    try {
      const e = await refusal(
        createIsolatedWorktree({
          repoDir: fixture.repo,
          worktreesDir: fixture.worktrees,
          branch: "crw/u1",
          from: { head: true },
        }),
      );
      expect(e.code).toBe("git_unavailable");
      expect(e.name).toBe("WorkspaceError");
    } finally {
      process.env.PATH = path;
    }
  });

  it("a branch name git refuses is invalid_input", async () => {
    fixture = makeRepo();
    const e = await refusal(
      createIsolatedWorktree({
        repoDir: fixture.repo,
        worktreesDir: fixture.worktrees,
        branch: "crw/bad..name",
        from: { head: true },
      }),
    );
    expect(e.code).toBe("invalid_input");
    const outside = await refusal(
      createIsolatedWorktree({
        repoDir: fixture.repo,
        worktreesDir: fixture.worktrees,
        branch: "crw/ok",
        from: { head: true },
        name: "..",
      }),
    );
    expect(outside.code).toBe("invalid_input");
    expect(sh(fixture.repo, "branch", "--list", "crw/ok")).toBe("");
  });
});
