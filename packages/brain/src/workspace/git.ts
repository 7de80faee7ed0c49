import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { WorkspaceError } from "./errors.js";

/**
 * git as a real process, never through a shell. Every call names its directory; nothing reads the caller's
 * cwd. Commits and reflog entries carry crw's own identity, so a machine with no git identity configured
 * works all the same and a reader of the history sees which commits crw made.
 */
export const CRW_GIT_IDENTITY: Readonly<Record<string, string>> = {
  GIT_AUTHOR_NAME: "crw",
  GIT_AUTHOR_EMAIL: "crw@localhost",
  GIT_COMMITTER_NAME: "crw",
  GIT_COMMITTER_EMAIL: "crw@localhost",
};

// A process started from a git hook (or by a tool that sets them) inherits variables that point git at
// another repository or index than the directory named; the directory alone must decide.
const LOCATION_VARIABLES = [
  "GIT_DIR",
  "GIT_WORK_TREE",
  "GIT_INDEX_FILE",
  "GIT_COMMON_DIR",
  "GIT_OBJECT_DIRECTORY",
  "GIT_ALTERNATE_OBJECT_DIRECTORIES",
  "GIT_NAMESPACE",
  "GIT_PREFIX",
];

export interface GitRunOptions {
  env?: Readonly<Record<string, string>>;
  input?: string;
  /** stdout beyond this kills git and fails the call: a runaway diff must not exhaust the daemon. */
  maxOutputBytes?: number;
  timeoutMs?: number;
}

export interface GitOutput {
  exitCode: number;
  stdout: string;
  stderr: string;
}

const DEFAULT_MAX_OUTPUT = 32 * 1024 * 1024;
const MAX_STDERR = 64 * 1024;
const DEFAULT_TIMEOUT_MS = 10 * 60 * 1000;

/**
 * crw runs git in directories an agent worked in: no hook, fsmonitor or pager the repository names runs
 * on the host, whatever its config says (the agent cannot write git metadata, but a repository it made
 * with `git init` inside its directory is its own).
 */
export const HARDENED = [
  "-c",
  "core.hooksPath=/dev/null",
  "-c",
  "core.fsmonitor=false",
  "-c",
  "core.pager=cat",
  "-c",
  "protocol.file.allow=never",
];

function gitEnv(extra: Readonly<Record<string, string>> | undefined): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const name of LOCATION_VARIABLES) delete env[name];
  // C locale: the few stderr texts matched below are git's English ones
  return { ...env, ...CRW_GIT_IDENTITY, GIT_TERMINAL_PROMPT: "0", LC_ALL: "C", ...extra };
}

/** Runs git in `cwd`; answers the exit code and output. A non-zero exit is data here, not an error. */
export function runGit(
  cwd: string,
  args: readonly string[],
  options: GitRunOptions = {},
): Promise<GitOutput> {
  const maxOutput = options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
  return new Promise((resolve, reject) => {
    let child: ChildProcessWithoutNullStreams;
    try {
      child = spawn("git", [...HARDENED, ...args], { cwd, env: gitEnv(options.env) });
    } catch (e) {
      // spawn throws (rather than emitting 'error') for arguments it cannot pass, such as a NUL byte
      const message = e instanceof Error ? e.message : String(e);
      reject(new WorkspaceError("invalid_input", `git ${args[0]} was not started: ${message}`, { cwd }));
      return;
    }
    const out: Buffer[] = [];
    let outBytes = 0;
    let err = "";
    let failure: WorkspaceError | null = null;
    const fail = (e: WorkspaceError) => {
      failure ??= e;
      child.kill("SIGKILL");
    };
    const timer = setTimeout(
      () => fail(gitError("git_failed", `git ${args[0]} timed out in ${cwd}`, cwd, args, { timedOut: true })),
      options.timeoutMs ?? DEFAULT_TIMEOUT_MS,
    );
    child.stdout.on("data", (chunk: Buffer) => {
      outBytes += chunk.length;
      if (outBytes > maxOutput)
        fail(gitError("git_failed", `git ${args[0]} wrote more than ${maxOutput} bytes`, cwd, args, {}));
      else out.push(chunk);
    });
    child.stderr.on("data", (chunk: Buffer) => {
      if (err.length < MAX_STDERR) err += chunk.toString("utf8").slice(0, MAX_STDERR - err.length);
    });
    // git exiting before it read its input makes the write fail with EPIPE; the exit code tells the story
    child.stdin.on("error", () => {});
    child.on("error", (e) => {
      clearTimeout(timer);
      failure ??= spawnFailure(cwd, args, e);
      reject(failure);
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      if (failure) return reject(failure);
      const exitCode = code ?? (signal ? 128 : 1);
      resolve({ exitCode, stdout: Buffer.concat(out).toString("utf8"), stderr: err });
    });
    child.stdin.end(options.input ?? "");
  });
}

function spawnFailure(cwd: string, args: readonly string[], e: Error): WorkspaceError {
  // spawn reports a missing cwd as ENOENT too, which would read as "git is not installed"
  if (!existsSync(cwd))
    return gitError("not_a_repository", `${cwd} does not exist`, cwd, args, { cause: e.message });
  return gitError("git_unavailable", `git could not be started: ${e.message}`, cwd, args, {});
}

function gitError(
  code: "git_failed" | "git_unavailable" | "not_a_repository",
  message: string,
  cwd: string,
  args: readonly string[],
  extra: Record<string, unknown>,
): WorkspaceError {
  return new WorkspaceError(code, message, { cwd, args: [...args], ...extra });
}

const LOCKED = /\.lock'?: File exists|cannot lock ref|Unable to create '.*\.lock'/;

/** The error for a git run that exited non-zero: a lock held by another git is its own, retryable, code. */
export function gitFailure(cwd: string, args: readonly string[], r: GitOutput): WorkspaceError {
  const stderr = r.stderr.trim();
  const code = LOCKED.test(stderr) ? "repository_locked" : "git_failed";
  return new WorkspaceError(code, `git ${args.join(" ")} failed in ${cwd}: ${stderr}`, {
    cwd,
    args: [...args],
    exitCode: r.exitCode,
    stderr,
  });
}

/** Runs git and answers its stdout as written; a non-zero exit is an error naming the command. */
export async function git(
  cwd: string,
  args: readonly string[],
  options: GitRunOptions = {},
): Promise<string> {
  const r = await runGit(cwd, args, options);
  if (r.exitCode !== 0) throw gitFailure(cwd, args, r);
  return r.stdout;
}

/** The same, for commands that answer one line (an object id, a path). */
export async function gitLine(
  cwd: string,
  args: readonly string[],
  options: GitRunOptions = {},
): Promise<string> {
  return (await git(cwd, args, options)).trim();
}

/** The fields of a `-z` output; paths are never unquoted or trimmed, so any file name survives. */
export function nulFields(stdout: string): string[] {
  const fields = stdout.split("\0");
  if (fields.at(-1) === "") fields.pop();
  return fields;
}
