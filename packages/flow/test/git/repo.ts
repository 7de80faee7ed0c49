import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { scratchDir } from "@crw/tools/scratch";

/** A real temporary git repository with one commit; its root is removed when the test file ends. */
export function tempRepo(prefix = "crw-git-"): {
  root: string;
  repo: string;
  start: string;
  sh: (cwd: string, ...args: string[]) => string;
} {
  const root = scratchDir(prefix);
  const repo = join(root, "repo");
  const env = {
    ...process.env,
    GIT_AUTHOR_NAME: "t",
    GIT_AUTHOR_EMAIL: "t@t",
    GIT_COMMITTER_NAME: "t",
    GIT_COMMITTER_EMAIL: "t@t",
  };
  const sh = (cwd: string, ...args: string[]) =>
    execFileSync("git", args, { cwd, env, encoding: "utf8" }).trim();
  execFileSync("git", ["init", "-q", "-b", "main", repo]);
  writeFileSync(join(repo, "a.txt"), "a\n");
  sh(repo, "add", "-A");
  sh(repo, "commit", "-q", "-m", "start");
  return { root, repo, start: sh(repo, "rev-parse", "HEAD"), sh };
}
