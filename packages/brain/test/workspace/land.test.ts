import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import {
  commitLeftovers,
  createIsolatedWorktree,
  type IsolatedWorktree,
  landBranch,
} from "../../src/workspace/index.js";
import { commitFiles, makeRepo, refusal, sh, snapshot, write } from "./helpers.js";

let fixture: ReturnType<typeof makeRepo>;
afterEach(() => fixture?.cleanup());

/** A repository on main with a child worktree that changed `files` (committed by crw). */
async function childDid(files: Record<string, string>, repoFiles?: Record<string, string>) {
  fixture = makeRepo(repoFiles);
  const wt = await createIsolatedWorktree({
    repoDir: fixture.repo,
    worktreesDir: fixture.worktrees,
    branch: "crw/l1",
    from: { head: true },
  });
  write(wt.path, files);
  const { commit } = await commitLeftovers({ worktree: wt, message: "crw: leftovers" });
  return { wt, tip: commit, repo: fixture.repo };
}

const land = (wt: IsolatedWorktree, into = wt.startedFromBranch ?? "main") =>
  landBranch({ repoDir: wt.repoRoot, branch: wt.branch, into });

describe("landBranch", () => {
  it("fast-forwards a branch checked out nowhere, touching no working tree", async () => {
    const { wt, tip, repo } = await childDid({ "feature.txt": "f\n" });
    sh(repo, "branch", "topic", wt.baseCommit);
    write(repo, { "README.md": "edited, not committed\n" });
    const mainBefore = snapshot(repo, "main");
    const landed = await land(wt, "topic");
    expect(landed).toEqual({
      into: "topic",
      before: wt.baseCommit,
      after: tip,
      fastForward: true,
      alreadyLanded: false,
      changedPaths: ["feature.txt"],
      updatedWorktree: null,
    });
    expect(sh(repo, "rev-parse", "refs/heads/topic")).toBe(tip);
    expect(snapshot(repo, "main")).toEqual(mainBefore);
  });

  it("fast-forwards the checked-out branch and brings its working tree and index along", async () => {
    const { wt, tip, repo } = await childDid({ "feature.txt": "f\n", "README.md": "changed by the child\n" });
    const landed = await land(wt);
    expect(landed.fastForward).toBe(true);
    expect(landed.updatedWorktree).toBe(repo);
    expect(sh(repo, "rev-parse", "HEAD")).toBe(tip);
    expect(readFileSync(join(repo, "feature.txt"), "utf8")).toBe("f\n");
    expect(readFileSync(join(repo, "README.md"), "utf8")).toBe("changed by the child\n");
    expect(sh(repo, "status", "--porcelain")).toBe("");
  });

  it("makes a crw merge commit when into moved on, in the checked-out worktree and in a bare ref", async () => {
    const { wt, tip, repo } = await childDid({ "feature.txt": "f\n" });
    sh(repo, "branch", "topic", wt.baseCommit);
    const moved = commitFiles(repo, { "parent.txt": "p\n" });
    const landed = await land(wt);
    expect(landed.fastForward).toBe(false);
    expect(landed.before).toBe(moved);
    expect(landed.changedPaths).toEqual(["feature.txt"]);
    expect(sh(repo, "log", "-1", "--format=%P|%an <%ae>|%s", landed.after)).toBe(
      `${moved} ${tip}|crw <crw@localhost>|Merge branch 'crw/l1' into main`,
    );
    expect(sh(repo, "rev-parse", "HEAD")).toBe(landed.after);
    expect(readFileSync(join(repo, "feature.txt"), "utf8")).toBe("f\n");
    expect(sh(repo, "status", "--porcelain")).toBe("");

    // the same where into is checked out nowhere: only the ref moves, to a descendant of where it was
    sh(repo, "checkout", "-q", "-b", "side", wt.baseCommit);
    const topicMoved = commitFiles(repo, { "topic.txt": "t\n" });
    sh(repo, "checkout", "-q", "main");
    sh(repo, "branch", "-f", "topic", topicMoved);
    const head = sh(repo, "rev-parse", "HEAD");
    const onTopic = await land(wt, "topic");
    expect(onTopic.fastForward).toBe(false);
    expect(onTopic.updatedWorktree).toBeNull();
    expect(sh(repo, "log", "-1", "--format=%P", onTopic.after)).toBe(`${topicMoved} ${tip}`);
    expect(sh(repo, "rev-parse", "refs/heads/topic")).toBe(onTopic.after);
    expect(sh(repo, "rev-parse", "HEAD")).toBe(head);
  });

  it("a conflict refuses, names the paths, and leaves into, its working tree and index as they were", async () => {
    const { wt, repo } = await childDid({ "shared.txt": "child\n" }, { "shared.txt": "base\n" });
    commitFiles(repo, { "shared.txt": "parent\n" });
    sh(repo, "branch", "topic", "main");
    write(repo, { "untracked.txt": "mine\n" });
    const clean = snapshot(repo, "main");
    const topicBefore = sh(repo, "rev-parse", "topic");
    const e = await refusal(land(wt));
    expect(e.code).toBe("merge_conflict");
    expect(e.context.paths).toEqual(["shared.txt"]);
    expect(snapshot(repo, "main")).toEqual(clean);
    expect(readFileSync(join(repo, "shared.txt"), "utf8")).toBe("parent\n");

    const onTopic = await refusal(land(wt, "topic"));
    expect(onTopic.code).toBe("merge_conflict");
    expect(onTopic.context.paths).toEqual(["shared.txt"]);
    expect(sh(repo, "rev-parse", "topic")).toBe(topicBefore);
    expect(snapshot(repo, "main")).toEqual(clean);
  });

  it("refuses a checked-out into whose worktree has uncommitted changes to tracked files", async () => {
    const { wt, repo } = await childDid({ "feature.txt": "f\n" });
    write(repo, { "README.md": "unsaved edit\n" });
    const before = snapshot(repo, "main");
    const e = await refusal(land(wt));
    expect(e.code).toBe("worktree_dirty");
    expect(e.context.paths).toEqual(["README.md"]);
    expect(snapshot(repo, "main")).toEqual(before);
    expect(readFileSync(join(repo, "README.md"), "utf8")).toBe("unsaved edit\n");

    // an untracked file alone is no reason to refuse, unless the result would overwrite it
    sh(repo, "checkout", "-q", "--", "README.md");
    write(repo, { "feature.txt": "the user's own\n" });
    const overwrite = await refusal(land(wt));
    expect(overwrite.code).toBe("worktree_dirty");
    expect(readFileSync(join(repo, "feature.txt"), "utf8")).toBe("the user's own\n");
    expect(sh(repo, "rev-parse", "main")).toBe(wt.baseCommit);
  });

  it("landing an already-landed branch is a no-op success", async () => {
    const { wt, tip, repo } = await childDid({ "feature.txt": "f\n" });
    const first = await land(wt);
    const mainAfter = snapshot(repo, "main");
    const second = await land(wt);
    expect(second).toEqual({
      into: "main",
      before: tip,
      after: tip,
      fastForward: true,
      alreadyLanded: true,
      changedPaths: [],
      updatedWorktree: null,
    });
    expect(first.alreadyLanded).toBe(false);
    expect(snapshot(repo, "main")).toEqual(mainAfter);
  });

  it("a child started inside a parent's worktree lands into the parent's branch and updates that worktree", async () => {
    fixture = makeRepo();
    const { repo, worktrees } = fixture;
    const parent = await createIsolatedWorktree({
      repoDir: repo,
      worktreesDir: worktrees,
      branch: "crw/parent",
      from: { head: true },
    });
    const child = await createIsolatedWorktree({
      repoDir: parent.path,
      worktreesDir: worktrees,
      branch: "crw/child",
      from: { head: true },
    });
    expect(child.startedFromBranch).toBe("crw/parent");
    write(child.path, { "child.txt": "c\n" });
    const { commit } = await commitLeftovers({ worktree: child, message: "m" });
    const mainBefore = snapshot(repo, "main");
    const landed = await land(child);
    expect(landed.updatedWorktree).toBe(parent.path);
    expect(sh(parent.path, "rev-parse", "HEAD")).toBe(commit);
    expect(readFileSync(join(parent.path, "child.txt"), "utf8")).toBe("c\n");
    expect(snapshot(repo, "main")).toEqual(mainBefore);
  });

  it("an unknown branch is unknown_ref", async () => {
    const { wt } = await childDid({ "feature.txt": "f\n" });
    expect((await refusal(land(wt, "no-such-branch"))).code).toBe("unknown_ref");
  });
});
