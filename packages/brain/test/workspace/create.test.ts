import { execFileSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import {
  commitLeftovers,
  createIsolatedWorktree,
  removeIsolatedWorktree,
} from "../../src/workspace/index.js";
import { commitFiles, makeRepo, refusal, sh, write } from "./helpers.js";

let fixture: ReturnType<typeof makeRepo>;
const realGit = execFileSync("sh", ["-c", "command -v git"], { encoding: "utf8" }).trim();
afterEach(() => fixture?.cleanup());

describe("createIsolatedWorktree", () => {
  it("makes a worktree on a new branch at the repository's HEAD, from any directory inside it", async () => {
    fixture = makeRepo({ "README.md": "hello\n", "src/a.ts": "a\n" });
    const { repo, worktrees } = fixture;
    const head = sh(repo, "rev-parse", "HEAD");
    const wt = await createIsolatedWorktree({
      repoDir: join(repo, "src"),
      worktreesDir: worktrees,
      branch: "crw/a1",
      from: { head: true },
    });
    expect(wt).toEqual({
      path: join(worktrees, "crw-a1"),
      branch: "crw/a1",
      baseCommit: head,
      startedFromBranch: "main",
      repoRoot: repo,
      reused: false,
    });
    expect(sh(wt.path, "symbolic-ref", "HEAD")).toBe("refs/heads/crw/a1");
    expect(sh(repo, "rev-parse", "refs/heads/crw/a1")).toBe(head);
    expect(readFileSync(join(wt.path, "src/a.ts"), "utf8")).toBe("a\n");
  });

  it("a worktree left locked while git was still checking it out is made again, never reused half-made", async () => {
    fixture = makeRepo({ "README.md": "hello\n", "src/a.ts": "a\n", "src/b.ts": "b\n" });
    const { repo, worktrees } = fixture;
    const first = await createIsolatedWorktree({
      repoDir: repo,
      worktreesDir: worktrees,
      branch: "crw/half",
      from: { head: true },
    });
    // What a SIGKILL during `git worktree add` leaves: the lock git takes for the checkout, files missing.
    sh(repo, "worktree", "lock", "--reason", "initializing", first.path);
    rmSync(join(first.path, "src"), { recursive: true, force: true });
    const again = await createIsolatedWorktree({
      repoDir: repo,
      worktreesDir: worktrees,
      branch: "crw/half",
      from: { head: true },
    });
    expect(again.path).toBe(first.path);
    expect(readFileSync(join(again.path, "src/b.ts"), "utf8")).toBe("b\n");
    const done = await commitLeftovers({
      worktree: { path: again.path, branch: again.branch },
      message: "m",
    });
    expect(done.committed).toBe(false);
  });

  it("reports a detached HEAD as no branch to land into, and starts from a given commit", async () => {
    fixture = makeRepo();
    const { repo, worktrees } = fixture;
    const first = sh(repo, "rev-parse", "HEAD");
    commitFiles(repo, { "b.txt": "b\n" });
    sh(repo, "checkout", "-q", "--detach");
    const wt = await createIsolatedWorktree({
      repoDir: repo,
      worktreesDir: worktrees,
      branch: "crw/c1",
      from: { commit: first },
    });
    expect(wt.startedFromBranch).toBeNull();
    expect(wt.baseCommit).toBe(first);
    expect(existsSync(join(wt.path, "b.txt"))).toBe(false);
  });

  it("worktrees asked for at once in one repository are made one after the other, then removed one after the other", async () => {
    fixture = makeRepo();
    const { repo, worktrees, root } = fixture;
    // A git in front of the real one that notes when each `worktree` command starts and ends, and holds it
    // long enough that two made at once could not miss each other.
    const bin = join(root, "bin");
    const log = join(root, "git.log");
    write(bin, {
      git: `#!/bin/sh\ncase " $* " in *" worktree add "*|*" worktree remove "*) echo start >> ${log}; sleep 0.05; ${realGit} "$@"; s=$?; echo end >> ${log}; exit $s;; esac\nexec ${realGit} "$@"\n`,
    });
    chmodSync(join(bin, "git"), 0o755);
    const path = process.env.PATH;
    process.env.PATH = `${bin}:${path}`;
    try {
      const made = await Promise.all(
        ["a", "b", "c", "d"].map((b) =>
          createIsolatedWorktree({
            repoDir: repo,
            worktreesDir: worktrees,
            branch: `crw/${b}`,
            from: { head: true },
          }),
        ),
      );
      expect(made.map((m) => m.reused)).toEqual([false, false, false, false]);
      await Promise.all(made.map((m) => removeIsolatedWorktree({ path: m.path })));
    } finally {
      process.env.PATH = path;
    }
    expect(readFileSync(log, "utf8").trim().split("\n")).toEqual(Array(8).fill(["start", "end"]).flat());
  });

  it("two parallel worktrees edit different files; a third from the merge of both branches sees both", async () => {
    fixture = makeRepo();
    const { repo, worktrees } = fixture;
    const base = { repoDir: repo, worktreesDir: worktrees, from: { head: true } } as const;
    const [one, two] = await Promise.all([
      createIsolatedWorktree({ ...base, branch: "crw/one" }),
      createIsolatedWorktree({ ...base, branch: "crw/two" }),
    ]);
    write(one.path, { "one.txt": "1\n" });
    write(two.path, { "two.txt": "2\n" });
    const [c1, c2] = await Promise.all([
      commitLeftovers({ worktree: one, message: "one" }),
      commitLeftovers({ worktree: two, message: "two" }),
    ]);
    const three = await createIsolatedWorktree({
      ...base,
      branch: "crw/three",
      from: { branches: ["crw/one", "crw/two"] },
    });
    expect(readFileSync(join(three.path, "one.txt"), "utf8")).toBe("1\n");
    expect(readFileSync(join(three.path, "two.txt"), "utf8")).toBe("2\n");
    // one merge commit made by crw, its parents the dependencies' tips in the order given
    expect(sh(repo, "log", "-1", "--format=%P", three.baseCommit)).toBe(`${c1.commit} ${c2.commit}`);
    expect(sh(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>", three.baseCommit)).toBe(
      "crw <crw@localhost>|crw <crw@localhost>",
    );
  });

  it("fast-forwards to the dependency branch that contains the others, making no commit", async () => {
    fixture = makeRepo();
    const { repo, worktrees } = fixture;
    sh(repo, "branch", "dep/a");
    const a = sh(repo, "rev-parse", "dep/a");
    sh(repo, "checkout", "-q", "-b", "dep/b");
    const b = commitFiles(repo, { "b.txt": "b\n" });
    sh(repo, "checkout", "-q", "main");
    const wt = await createIsolatedWorktree({
      repoDir: repo,
      worktreesDir: worktrees,
      branch: "crw/ff",
      from: { branches: ["dep/a", "dep/b"] },
    });
    expect(wt.baseCommit).toBe(b);
    expect(wt.baseCommit).not.toBe(a);
  });

  it("conflicting branches are merge_conflict with the paths, and leave no branch, worktree or directory", async () => {
    fixture = makeRepo({ "shared.txt": "base\n" });
    const { repo, worktrees } = fixture;
    for (const [branch, content] of [
      ["dep/x", "x\n"],
      ["dep/y", "y\n"],
    ] as const) {
      sh(repo, "checkout", "-q", "-b", branch, "main");
      commitFiles(repo, { "shared.txt": content, [`${branch.slice(4)}.txt`]: "own\n" });
    }
    sh(repo, "checkout", "-q", "main");
    const listBefore = sh(repo, "worktree", "list", "--porcelain");
    const branchesBefore = sh(repo, "branch", "--list");
    const e = await refusal(
      createIsolatedWorktree({
        repoDir: repo,
        worktreesDir: worktrees,
        branch: "crw/m1",
        from: { branches: ["dep/x", "dep/y"] },
      }),
    );
    expect(e.code).toBe("merge_conflict");
    expect(e.retryable).toBe(false);
    expect(e.context.paths).toEqual(["shared.txt"]);
    expect(e.context.merging).toEqual(["dep/x", "dep/y"]);
    expect(sh(repo, "branch", "--list", "crw/m1")).toBe("");
    expect(sh(repo, "branch", "--list")).toBe(branchesBefore);
    expect(existsSync(join(worktrees, "crw-m1"))).toBe(false);
    expect(sh(repo, "worktree", "list", "--porcelain")).toBe(listBefore);
  });

  it("a retry after the worktree was made reuses it, with the base it was made at", async () => {
    fixture = makeRepo();
    const { repo, worktrees } = fixture;
    const options = {
      repoDir: repo,
      worktreesDir: worktrees,
      branch: "crw/r1",
      from: { head: true },
    } as const;
    const first = await createIsolatedWorktree(options);
    write(first.path, { "work.txt": "committed\n" });
    const { commit } = await commitLeftovers({ worktree: first, message: "m" });
    write(first.path, { "more.txt": "in progress\n" });
    commitFiles(repo, { "later.txt": "the parent moved on\n" });
    const again = await createIsolatedWorktree(options);
    // the base is read back from the branch, not recomputed: neither the moved HEAD nor the tip
    expect(again).toEqual({ ...first, reused: true });
    expect(again.baseCommit).not.toBe(commit);
    expect(readFileSync(join(again.path, "more.txt"), "utf8")).toBe("in progress\n");
    expect(sh(repo, "worktree", "list", "--porcelain").match(/^worktree /gm)).toHaveLength(2);
  });

  it("a retry after a crash that left the branch but no worktree (or an empty directory) checks the branch out", async () => {
    fixture = makeRepo();
    const { repo, worktrees } = fixture;
    const base = sh(repo, "rev-parse", "HEAD");
    sh(repo, "-c", "core.logAllRefUpdates=true", "branch", "crw/k1", base);
    mkdirSync(join(worktrees, "crw-k1"), { recursive: true });
    commitFiles(repo, { "later.txt": "moved\n" });
    const wt = await createIsolatedWorktree({
      repoDir: repo,
      worktreesDir: worktrees,
      branch: "crw/k1",
      from: { head: true },
    });
    expect(wt.reused).toBe(true);
    expect(wt.baseCommit).toBe(base);
    expect(sh(wt.path, "symbolic-ref", "HEAD")).toBe("refs/heads/crw/k1");
  });

  it("a retry after the worktree's directory was deleted prunes the registration and makes it again", async () => {
    fixture = makeRepo();
    const { repo, worktrees } = fixture;
    const options = {
      repoDir: repo,
      worktreesDir: worktrees,
      branch: "crw/g1",
      from: { head: true },
    } as const;
    const first = await createIsolatedWorktree(options);
    write(first.path, { "kept.txt": "on the branch\n" });
    await commitLeftovers({ worktree: first, message: "m" });
    rmSync(first.path, { recursive: true, force: true });
    const again = await createIsolatedWorktree(options);
    expect(again).toEqual({ ...first, reused: true });
    expect(readFileSync(join(again.path, "kept.txt"), "utf8")).toBe("on the branch\n");
  });

  it("refuses a path taken by something else, and a branch checked out elsewhere", async () => {
    fixture = makeRepo();
    const { repo, worktrees } = fixture;
    write(worktrees, { "taken/file.txt": "someone's\n" });
    const taken = await refusal(
      createIsolatedWorktree({
        repoDir: repo,
        worktreesDir: worktrees,
        branch: "crw/t1",
        from: { head: true },
        name: "taken",
      }),
    );
    expect(taken.code).toBe("worktree_conflict");
    expect(readFileSync(join(worktrees, "taken/file.txt"), "utf8")).toBe("someone's\n");
    expect(sh(repo, "branch", "--list", "crw/t1")).toBe("");
    const elsewhere = await refusal(
      createIsolatedWorktree({
        repoDir: repo,
        worktreesDir: worktrees,
        branch: "main",
        from: { head: true },
      }),
    );
    expect(elsewhere.code).toBe("worktree_conflict");
    expect(elsewhere.context.checkedOutAt).toBe(repo);
  });
});
