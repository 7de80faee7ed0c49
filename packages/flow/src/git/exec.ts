import { execFile } from "node:child_process";

/**
 * Git as a real process. Every call names its directory; nothing reads the caller's cwd. The identity of
 * the commits crw makes is crw's own, so a machine with no git identity configured commits all the same.
 */
export type GitErrorCode =
  | "git_failed"
  | "ref_invalid"
  | "not_fast_forward"
  | "head_moved"
  | "not_a_checkout";

export class GitWorkspaceError extends Error {
  override readonly name = "GitWorkspaceError";
  readonly retryable = false;
  constructor(
    readonly code: GitErrorCode,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
  ) {
    super(message);
  }
}

export const CRW_IDENTITY: NodeJS.ProcessEnv = {
  GIT_AUTHOR_NAME: "crw flow",
  GIT_AUTHOR_EMAIL: "crw-flow@localhost",
  GIT_COMMITTER_NAME: "crw flow",
  GIT_COMMITTER_EMAIL: "crw-flow@localhost",
};

export interface GitResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Agents worked in the directories crw runs git in: no hook, fsmonitor or pager a repository's config
 * names runs as crw, and a location variable inherited from a git hook never points git elsewhere.
 */
const HARDENED = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.pager=cat"];
const LOCATION_VARIABLES = [
  "GIT_DIR",
  "GIT_WORK_TREE",
  "GIT_INDEX_FILE",
  "GIT_COMMON_DIR",
  "GIT_OBJECT_DIRECTORY",
];

function gitEnv(extra: NodeJS.ProcessEnv | undefined): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, GIT_TERMINAL_PROMPT: "0", GIT_OPTIONAL_LOCKS: "0" };
  for (const name of LOCATION_VARIABLES) delete env[name];
  return { ...env, ...extra };
}

/** Runs git in `cwd`; answers the exit code and output (never throws for a non-zero exit). */
export function gitRun(
  cwd: string,
  args: string[],
  options: { env?: NodeJS.ProcessEnv; input?: string } = {},
): Promise<GitResult> {
  return new Promise((resolve, reject) => {
    const child = execFile(
      "git",
      [...HARDENED, ...args],
      {
        cwd,
        env: gitEnv(options.env),
        maxBuffer: 64 * 1024 * 1024,
        encoding: "utf8",
      },
      (err, stdout, stderr) => {
        if (err && typeof (err as { code?: unknown }).code !== "number") {
          reject(new GitWorkspaceError("git_failed", `git ${args[0]} could not run: ${err.message}`));
          return;
        }
        resolve({ code: err ? ((err as { code: number }).code ?? 1) : 0, stdout, stderr });
      },
    );
    if (options.input !== undefined) child.stdin?.end(options.input);
  });
}

/** Runs git and answers its trimmed stdout; a non-zero exit is a `git_failed` error naming the command. */
export async function git(
  cwd: string,
  args: string[],
  options: { env?: NodeJS.ProcessEnv; input?: string } = {},
): Promise<string> {
  const r = await gitRun(cwd, args, options);
  if (r.code !== 0)
    throw new GitWorkspaceError("git_failed", `git ${args.join(" ")} failed in ${cwd}: ${r.stderr.trim()}`, {
      args,
      cwd,
      exitCode: r.code,
    });
  return r.stdout.trim();
}
