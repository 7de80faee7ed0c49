import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { WorkspaceError } from "../../src/workspace/index.js";

// The tests' own commits (the "user's") carry an identity of their own, so crw's commits stand out.
const USER_ENV = {
  ...process.env,
  GIT_AUTHOR_NAME: "user",
  GIT_AUTHOR_EMAIL: "user@example.com",
  GIT_COMMITTER_NAME: "user",
  GIT_COMMITTER_EMAIL: "user@example.com",
  GIT_TERMINAL_PROMPT: "0",
};

/** git run synchronously as the user would; the trimmed stdout. */
export function sh(dir: string, ...args: string[]): string {
  return execFileSync("git", args, { cwd: dir, env: USER_ENV, encoding: "utf8" }).trim();
}

export function write(dir: string, files: Record<string, string>): void {
  for (const [path, content] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, path)), { recursive: true });
    writeFileSync(join(dir, path), content);
  }
}

/** A temp root holding `repo` (on main, with one commit of `files`) and room for worktrees beside it. */
export function makeRepo(files: Record<string, string> = { "README.md": "hello\n" }): {
  root: string;
  repo: string;
  worktrees: string;
  cleanup: () => void;
} {
  const root = realpathSync(mkdtempSync(join(tmpdir(), "crw-workspace-")));
  const repo = join(root, "repo");
  mkdirSync(repo);
  sh(repo, "init", "-q", "-b", "main");
  write(repo, files);
  sh(repo, "add", "-A");
  sh(repo, "commit", "-q", "-m", "initial");
  return {
    root,
    repo,
    worktrees: join(root, "worktrees"),
    cleanup: () => rmSync(root, { recursive: true, force: true }),
  };
}

/** A user commit of `files` on whatever `dir` has checked out. */
export function commitFiles(dir: string, files: Record<string, string>, message = "user change"): string {
  write(dir, files);
  sh(dir, "add", "-A");
  sh(dir, "commit", "-q", "-m", message);
  return sh(dir, "rev-parse", "HEAD");
}

/** The error a promise rejects with, as a WorkspaceError; fails the test when it resolves. */
export async function refusal(promise: Promise<unknown>): Promise<WorkspaceError> {
  try {
    await promise;
  } catch (e) {
    if (e instanceof WorkspaceError) return e;
    throw e;
  }
  throw new Error("expected a WorkspaceError, the call succeeded");
}

/** Everything a landing must leave alone: ref, HEAD, status, index entries. */
export function snapshot(dir: string, branch: string) {
  return {
    ref: sh(dir, "rev-parse", `refs/heads/${branch}`),
    head: sh(dir, "rev-parse", "HEAD"),
    status: sh(dir, "status", "--porcelain", "--untracked-files=all"),
    index: sh(dir, "ls-files", "--stage"),
  };
}
