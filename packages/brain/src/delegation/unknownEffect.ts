import { execFile } from "node:child_process";
import { lstat } from "node:fs/promises";
import { isAbsolute, relative, resolve } from "node:path";
import { HARDENED } from "../workspace/git.js";

/** Tools whose call changes files or runs programs: an interrupted one may have done part of its work. */
const EFFECT_TOOLS = new Set(["shell", "write", "edit"]);
const MAX_STATUS_LINES = 40;
/** Bounded like any helper program: a repository git cannot read in this long says so instead. */
const STATUS_TIMEOUT_MS = 10_000;

function gitStatus(workDir: string): Promise<string | undefined> {
  return new Promise((done) => {
    execFile(
      "git",
      [...HARDENED, "status", "--porcelain=v1", "--untracked-files=all"],
      {
        cwd: workDir,
        timeout: STATUS_TIMEOUT_MS,
        maxBuffer: 1024 * 1024,
        env: { ...process.env, GIT_OPTIONAL_LOCKS: "0" },
      },
      (err, stdout) => done(err ? undefined : stdout),
    );
  });
}

/**
 * What the working directory shows now, for a call of unknown outcome that may have changed it: the
 * repository's uncommitted changes (git status), and for a write or edit whether its file exists and its
 * size. The next turn decides from this, instead of crw running the call again.
 */
export async function workDirNow(
  workDir: string | null,
  call: { name: string; arguments?: Record<string, unknown> },
): Promise<string> {
  if (!workDir || !EFFECT_TOOLS.has(call.name)) return "";
  const lines: string[] = [];
  const path = typeof call.arguments?.path === "string" ? call.arguments.path : undefined;
  if (path && call.name !== "shell") {
    const absolute = resolve(workDir, path);
    const rel = relative(workDir, absolute);
    if (!rel.startsWith("..") && !isAbsolute(rel)) {
      // lstat: a link the agent left must not report on what lies outside the directory.
      const info = await lstat(absolute).catch(() => undefined);
      lines.push(info ? `${rel} exists now (${info.size} bytes)` : `${rel} does not exist now`);
    }
  }
  const status = await gitStatus(workDir);
  if (status === undefined) lines.push("the working directory is not a git repository crw can read");
  else if (status.trim() === "") lines.push("git status: no uncommitted changes");
  else {
    const changed = status.trimEnd().split("\n");
    lines.push(`git status (${changed.length} changed):`, ...changed.slice(0, MAX_STATUS_LINES));
    if (changed.length > MAX_STATUS_LINES) lines.push(`… and ${changed.length - MAX_STATUS_LINES} more`);
  }
  return `\nWhat the working directory shows now:\n${lines.join("\n")}`;
}
