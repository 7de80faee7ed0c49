import { constants } from "node:fs";
import { access, readFile, realpath, stat } from "node:fs/promises";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { DelegatedScopeError } from "./errors.js";
import { normalizePlacement, posixInside } from "./paths.js";
import type { ExecutionTarget } from "./schema.js";

/** A registered host project, as the host's project registry answers `projectForPath`. */
export interface HostProject {
  readonly ref: string;
  readonly root: string;
}

/**
 * The child's own live policy, which decides where it may be placed:
 * - `scoped`: a caller bound to one host project stays inside that project's root;
 * - `admin`: an all-access administrator with `canExecuteHost` may pick any existing readable host
 *   directory; the host's registry (`projectForPath`) names its project, else the nameless host target;
 * - `managed`: a guest keeps its mount and inherited (narrower) root, with no host file access here;
 * - `local`: a paired computer; POSIX, Windows drive and UNC placements are accepted and the computer's
 *   actual platform is checked later, at target admission.
 */
export type WorkDirPolicy =
  | { readonly kind: "scoped"; readonly project: HostProject }
  | {
      readonly kind: "admin";
      readonly canExecuteHost: boolean;
      readonly projectForPath?: (dir: string) => Promise<HostProject | undefined> | HostProject | undefined;
    }
  | { readonly kind: "managed"; readonly ref: string; readonly guestRoot: string }
  | { readonly kind: "local"; readonly targetId: string };

export interface WorkDirPlacement {
  /** What `DelegatedExecutionScope.workDir` records. */
  readonly workDir: string;
  /** What `DelegatedExecutionScope.target` records together with it. */
  readonly target: ExecutionTarget;
  readonly projectRef: string | null;
  /** Where project instructions are read from: a linked worktree's own root, else the project root. */
  readonly instructionRoot: string | null;
}

/**
 * Validates a Delegate `cwd` or a workflow node's `cwd` against the child's own live policy and returns the
 * placement to persist. Refusals are `DelegatedScopeError`s; nothing is created or changed on disk.
 */
export async function delegatedWorkDir(cwd: string, policy: WorkDirPolicy): Promise<WorkDirPlacement> {
  const targetKind = policy.kind === "local" ? "local" : policy.kind === "managed" ? "managed" : "host";
  const placed = normalizePlacement(cwd, targetKind);
  if (!placed.ok)
    throw new DelegatedScopeError("invalid_work_dir", `working directory refused: ${placed.reason}`, { cwd });
  const path = placed.path;

  switch (policy.kind) {
    case "local":
      return {
        workDir: path,
        target: { kind: "local", targetId: policy.targetId },
        projectRef: null,
        instructionRoot: null,
      };
    case "managed": {
      const root = normalizePlacement(policy.guestRoot, "managed");
      if (!root.ok || !posixInside(root.path, path)) {
        throw new DelegatedScopeError(
          "work_dir_outside_project",
          "working directory is outside the managed root",
          {
            cwd,
            root: policy.guestRoot,
          },
        );
      }
      return {
        workDir: path,
        target: { kind: "managed", ref: policy.ref, root: root.path },
        projectRef: policy.ref,
        instructionRoot: root.path,
      };
    }
    case "scoped": {
      const real = await existingDirectory(path);
      const root = await existingDirectory(policy.project.root);
      const context = await projectContextRoot(real);
      // A linked worktree of the project's repository (an isolated child's) counts as the project.
      const linked =
        context !== undefined &&
        context.root !== context.repositoryRoot &&
        posixInside(root, context.repositoryRoot);
      if (linked) {
        return {
          workDir: real,
          target: { kind: "host", ref: policy.project.ref },
          projectRef: policy.project.ref,
          instructionRoot: context.root,
        };
      }
      if (!posixInside(root, real)) {
        throw new DelegatedScopeError(
          "work_dir_outside_project",
          "working directory is outside the selected project",
          {
            cwd,
            project: policy.project.ref,
          },
        );
      }
      const instructionRoot = context && posixInside(root, context.root) ? context.root : root;
      return {
        workDir: real,
        target: { kind: "host", ref: policy.project.ref },
        projectRef: policy.project.ref,
        instructionRoot,
      };
    }
    case "admin": {
      if (!policy.canExecuteHost) {
        throw new DelegatedScopeError(
          "work_dir_not_permitted",
          "only an all-access administrator may pick a host directory",
          { cwd },
        );
      }
      const real = await existingDirectory(path);
      const registered = await policy.projectForPath?.(real);
      if (registered) {
        return {
          workDir: real,
          target: { kind: "host", ref: registered.ref },
          projectRef: registered.ref,
          instructionRoot: real,
        };
      }
      // A linked worktree belongs to the repository it was added from: keep that project's ref, but read
      // instructions from the worktree itself.
      const context = await projectContextRoot(real);
      if (context && context.repositoryRoot !== context.root) {
        const origin = await policy.projectForPath?.(context.repositoryRoot);
        if (origin) {
          return {
            workDir: real,
            target: { kind: "host", ref: origin.ref },
            projectRef: origin.ref,
            instructionRoot: context.root,
          };
        }
      }
      return {
        workDir: real,
        target: { kind: "host", ref: null },
        projectRef: null,
        instructionRoot: context?.root ?? real,
      };
    }
  }
}

async function existingDirectory(path: string): Promise<string> {
  let real: string;
  try {
    real = await realpath(path);
    if (!(await stat(real)).isDirectory()) throw new Error("not a directory");
    await access(real, constants.R_OK | constants.X_OK);
  } catch (e) {
    const cause = e instanceof Error ? e : new Error(String(e));
    throw new DelegatedScopeError(
      "work_dir_unavailable",
      `working directory is not an existing readable directory: ${path}`,
      {
        cwd: path,
        cause: cause.message,
      },
    );
  }
  return real;
}

export interface ProjectContext {
  /** The working tree holding `dir` (a linked worktree's own root for a worktree). */
  readonly root: string;
  /** The main working tree of the repository that owns the Git common directory. */
  readonly repositoryRoot: string;
}

/**
 * Finds the Git working tree around `dir`. A linked worktree has a `.git` file (`gitdir: <path>`) whose
 * directory holds a `commondir` file naming the repository's shared Git directory; that proves which
 * repository the worktree belongs to without running Git.
 */
export async function projectContextRoot(dir: string): Promise<ProjectContext | undefined> {
  let current = resolve(dir);
  for (;;) {
    const dotGit = join(current, ".git");
    const info = await stat(dotGit).catch(() => undefined);
    if (info?.isDirectory()) return { root: current, repositoryRoot: current };
    if (info?.isFile()) {
      const text = await readFile(dotGit, "utf8").catch(() => "");
      const match = /^gitdir:\s*(.+?)\s*$/m.exec(text);
      if (!match?.[1]) return undefined;
      const gitDir = isAbsolute(match[1]) ? match[1] : resolve(current, match[1]);
      const common = await readFile(join(gitDir, "commondir"), "utf8").catch(() => undefined);
      if (common === undefined) return { root: current, repositoryRoot: current };
      const commonDir = resolve(gitDir, common.trim());
      // A `.git` file is only text: anyone who can write the directory could name any "repository" in
      // it. A linked worktree is believed when git's own layout vouches for it: its gitdir lives under the
      // common directory's worktrees/ and links back to this `.git`.
      if (!(await linksBack(gitDir, commonDir, dotGit))) return undefined;
      const repositoryRoot = commonDir.endsWith("/.git") ? dirname(commonDir) : commonDir;
      return { root: current, repositoryRoot: await realpath(repositoryRoot).catch(() => repositoryRoot) };
    }
    const parent = dirname(current);
    if (parent === current) return undefined;
    current = parent;
  }
}

async function linksBack(gitDir: string, commonDir: string, dotGit: string): Promise<boolean> {
  const [gitReal, commonReal, dotGitReal] = await Promise.all(
    [gitDir, commonDir, dotGit].map((p) => realpath(p).catch(() => undefined)),
  );
  if (!gitReal || !commonReal || !dotGitReal || dirname(gitReal) !== join(commonReal, "worktrees"))
    return false;
  const back = (await readFile(join(gitReal, "gitdir"), "utf8").catch(() => "")).trim();
  return back !== "" && (await realpath(resolve(gitReal, back)).catch(() => undefined)) === dotGitReal;
}

/**
 * Channel admission of a stored placement before a continuation or recovery turn: the stored `workDir` is
 * replayed (never the parent's current directory) and must still exist, and for a host target it must
 * still resolve to the same project ref it was captured with.
 */
export async function admitStoredWorkDir(
  scope: { readonly workDir: string | null; readonly target: ExecutionTarget },
  projectForPath?: (dir: string) => Promise<HostProject | undefined> | HostProject | undefined,
): Promise<string | null> {
  if (scope.workDir === null || scope.target.kind !== "host") return scope.workDir;
  const real = await existingDirectory(scope.workDir);
  if (scope.target.ref !== null && projectForPath) {
    let project = await projectForPath(real);
    if (!project) {
      const context = await projectContextRoot(real);
      if (context) project = await projectForPath(context.repositoryRoot);
    }
    if (project?.ref !== scope.target.ref) {
      throw new DelegatedScopeError(
        "work_dir_unavailable",
        "the stored working directory no longer belongs to its host target",
        {
          cwd: scope.workDir,
          target: scope.target.ref,
          now: project?.ref ?? null,
        },
      );
    }
  }
  return real;
}
