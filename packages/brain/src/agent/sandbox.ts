import { constants } from "node:fs";
import { access, lstat, readdir, readlink, realpath, stat } from "node:fs/promises";
import { delimiter, dirname, isAbsolute, join, relative, sep } from "node:path";
import { projectContextRoot } from "../scope/index.js";
import { SandboxUnavailableError } from "./errors.js";

/**
 * The OS boundary of the child's `shell` tool: every command runs under bubblewrap in fresh namespaces
 * (user, mount, pid, network, ipc, uts, cgroup), so what a command can touch is decided by mounts, not by
 * reading its words. The sandbox sees:
 * - the working directory, read-write (read-only in a read-only turn);
 * - the Git metadata of the repository around it (the worktree's `.git` and the common Git directory, and
 *   the rest of the working tree when `workDir` is a subdirectory of it), always read-only: crw commits
 *   for the agent, and writable hooks or config would run on the host;
 * - the system directories programs need (`SYSTEM_DIRS`) and the directory of the running Node, read-only,
 *   with the secrets root owns in /etc masked;
 * - a private tmpfs at /tmp (also HOME), a minimal /dev and a /proc of its own pid namespace.
 * Nothing else of the host exists inside; no network (only a loopback of its own); no capabilities and no
 * nested user namespaces, so it cannot remount its read-only views. The command's shell is not pid 1: when
 * it exits, bwrap's init exits and the kernel kills whatever it left behind.
 */
export interface SandboxSpec {
  readonly workDir: string;
  readonly readOnly: boolean;
}

export interface SandboxInvocation {
  /** The bwrap executable to spawn, with `args`, in `env` (the only environment the command sees). */
  readonly file: string;
  readonly args: readonly string[];
  readonly env: Readonly<Record<string, string>>;
}

/**
 * The command's wrapper writes one byte to this inherited descriptor once bwrap has built the sandbox and
 * the shell is about to start, then closes it for the command. No byte means bwrap itself failed, which
 * must not be mistaken for the command failing.
 */
export const SANDBOX_STARTED_FD = 3;
const STARTED_SCRIPT = `printf . >&${SANDBOX_STARTED_FD} && exec /bin/sh -c "$1" ${SANDBOX_STARTED_FD}>&-`;

const SYSTEM_DIRS = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/opt"];
/**
 * Readable by root only on the host, but the sandboxed uid is still root's when the daemon runs as root.
 * They are covered with /dev/null, which cannot be opened on bwrap's nodev mounts: reading them fails.
 */
const ETC_SECRET_FILES = ["/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers"];
const ETC_SECRET_DIRS = ["/etc/ssl/private", "/etc/sudoers.d"];
/** The variables a command may inherit: locale and terminal, never the daemon's credentials. */
const PASSED_ENV = ["PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TERM"];
const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** The argv and environment that run `command` with `/bin/sh -c` inside the sandbox. */
export async function sandboxInvocation(
  command: string,
  spec: SandboxSpec,
  hostEnv: NodeJS.ProcessEnv = process.env,
): Promise<SandboxInvocation> {
  const file = await locateBwrap(hostEnv);
  const args = [...(await sandboxArgs(spec)), "--", "/bin/sh", "-c", STARTED_SCRIPT, "sh", command];
  return { file, args, env: sandboxEnv(hostEnv) };
}

/** The bubblewrap options of the policy above, before the command. Later mounts cover earlier ones. */
export async function sandboxArgs(spec: SandboxSpec): Promise<string[]> {
  const workDir = await realpath(spec.workDir);
  const git = await gitMetadataPaths(workDir);
  const [underWorkDir, elsewhere] = partition(git, (p) => inside(workDir, p));
  return [
    ...["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL"],
    ...["--die-with-parent", "--new-session"],
    ...(await systemMounts()),
    ...["--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc"],
    ...(await etcSecretMasks()),
    // Git metadata that holds the working directory must not cover it; metadata inside it must cover it.
    ...elsewhere.flatMap((p) => ["--ro-bind", p, p]),
    spec.readOnly ? "--ro-bind" : "--bind",
    workDir,
    workDir,
    ...underWorkDir.flatMap((p) => ["--ro-bind", p, p]),
    // The root is bwrap's own tmpfs holding the mount points: nothing is written there either.
    ...["--remount-ro", "/", "--chdir", workDir],
  ];
}

/** `CRW_BWRAP` (a path or a program name) or `bwrap`, searched on the host's PATH. */
export async function locateBwrap(hostEnv: NodeJS.ProcessEnv = process.env): Promise<string> {
  const wanted = hostEnv.CRW_BWRAP || "bwrap";
  const candidates = wanted.includes("/")
    ? [wanted]
    : (hostEnv.PATH ?? DEFAULT_PATH)
        .split(delimiter)
        .filter((dir) => isAbsolute(dir))
        .map((dir) => join(dir, wanted));
  for (const candidate of candidates) {
    if (await isExecutableFile(candidate)) return candidate;
  }
  throw bwrapMissing(wanted, hostEnv.CRW_BWRAP ? `CRW_BWRAP=${hostEnv.CRW_BWRAP}` : "bwrap on PATH");
}

export function bwrapMissing(bwrap: string, where: string): SandboxUnavailableError {
  return new SandboxUnavailableError(
    "bwrap_missing",
    `shell unavailable: the sandbox program was not found (${where}). Install bubblewrap ` +
      "(apt-get install bubblewrap, or dnf install bubblewrap) or set CRW_BWRAP to its path; " +
      "commands never run outside the sandbox.",
    { bwrap },
  );
}

/** Classifies the output of a bwrap that exited before the command started. */
export function sandboxSetupError(bwrap: string, output: string): SandboxUnavailableError {
  const detail = output.trim().split("\n").slice(-5).join("\n") || "no message";
  if (/namespace|uid map|gid map|operation not permitted|permission denied/i.test(detail)) {
    return new SandboxUnavailableError(
      "namespaces_unavailable",
      `shell unavailable: bubblewrap cannot create its namespaces here (${detail}). Unprivileged user ` +
        "namespaces are disabled or restricted on this machine (sysctl kernel.unprivileged_userns_clone, " +
        "user.max_user_namespaces, an AppArmor or container policy): allow them for bwrap; " +
        "commands never run outside the sandbox.",
      { bwrap, detail },
    );
  }
  return new SandboxUnavailableError(
    "sandbox_setup_failed",
    `shell unavailable: bubblewrap could not set up the sandbox (${detail}); commands never run outside it.`,
    { bwrap, detail },
  );
}

function sandboxEnv(hostEnv: NodeJS.ProcessEnv): Record<string, string> {
  const env: Record<string, string> = {};
  for (const name of PASSED_ENV) {
    const value = hostEnv[name];
    if (value !== undefined) env[name] = value;
  }
  const path = (env.PATH ?? DEFAULT_PATH).split(delimiter);
  const nodeDir = dirname(process.execPath);
  env.PATH = (path.includes(nodeDir) ? path : [...path, nodeDir]).join(delimiter);
  return { ...env, HOME: "/tmp", TMPDIR: "/tmp" };
}

/** Merged-/usr links stay links; a real directory is bound read-only; Node's own directory is added. */
async function systemMounts(): Promise<string[]> {
  const args: string[] = [];
  const bound: string[] = [];
  for (const dir of SYSTEM_DIRS) {
    const info = await lstat(dir).catch(() => undefined);
    if (!info) continue;
    const real = await realpath(dir).catch(() => undefined);
    if (real === undefined) continue;
    if (info.isSymbolicLink() && bound.some((b) => inside(b, real))) {
      args.push("--symlink", await readlink(dir), dir);
    } else if ((await stat(real)).isDirectory()) {
      args.push("--ro-bind", real, dir);
      bound.push(real);
    }
  }
  const nodeDir = await realpath(dirname(process.execPath));
  if (!bound.some((b) => inside(b, nodeDir))) args.push("--ro-bind", nodeDir, nodeDir);
  return args;
}

async function etcSecretMasks(): Promise<string[]> {
  if (!(await lstat("/etc").catch(() => undefined))?.isDirectory()) return [];
  const sshKeys = (await readdir("/etc/ssh").catch(() => [] as string[]))
    .filter((name) => /^ssh_host_.*_key$/.test(name))
    .map((name) => join("/etc/ssh", name));
  const args: string[] = [];
  for (const file of [...ETC_SECRET_FILES, ...sshKeys]) {
    if ((await lstat(file).catch(() => undefined))?.isFile()) args.push("--ro-bind", "/dev/null", file);
  }
  for (const dir of ETC_SECRET_DIRS) {
    if ((await lstat(dir).catch(() => undefined))?.isDirectory())
      args.push("--tmpfs", dir, "--remount-ro", dir);
  }
  return args;
}

/**
 * What Git reads to answer status, diff and log: the `.git` of the working tree around `workDir` and, for
 * a linked worktree, the repository's common Git directory, which holds the worktree's own gitdir
 * (`worktrees/<name>`) as `git worktree add` places it. When `workDir` is below the working tree's root,
 * the whole tree is needed too: without it Git reports every file outside `workDir` as deleted.
 * Outer paths come first so that no mount hides one inside it.
 */
async function gitMetadataPaths(workDir: string): Promise<string[]> {
  const context = await projectContextRoot(workDir);
  if (!context) return [];
  const paths = [context.root === workDir ? join(context.root, ".git") : context.root];
  if (context.repositoryRoot !== context.root) {
    const common = join(context.repositoryRoot, ".git");
    // A bare repository is its own common directory.
    paths.push((await stat(common).catch(() => undefined))?.isDirectory() ? common : context.repositoryRoot);
  }
  // A dangling link in a broken checkout must cost Git inside, not every command.
  const present = await Promise.all(
    paths.map((p) =>
      lstat(p).then(
        () => true,
        () => false,
      ),
    ),
  );
  return paths.filter((_, i) => present[i]).sort((a, b) => a.length - b.length);
}

async function isExecutableFile(path: string): Promise<boolean> {
  try {
    if (!(await stat(path)).isFile()) return false;
    await access(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function inside(dir: string, path: string): boolean {
  const rel = relative(dir, path);
  return rel === "" || (rel !== ".." && !rel.startsWith(`..${sep}`) && !isAbsolute(rel));
}

function partition<T>(items: readonly T[], test: (item: T) => boolean): [T[], T[]] {
  return [items.filter(test), items.filter((item) => !test(item))];
}
