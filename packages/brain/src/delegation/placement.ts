import { isAbsolute, resolve } from "node:path";
import type { Account } from "@crw/db";
import { DelegatedScopeError } from "../scope/errors.js";
import { posixInside } from "../scope/paths.js";
import type { DelegatedExecutionScope, ExecutionTarget } from "../scope/schema.js";
import {
  delegatedWorkDir,
  type HostProject,
  projectContextRoot,
  type WorkDirPlacement,
  type WorkDirPolicy,
} from "../scope/workdir.js";
import type { DelegationServiceOptions } from "./types.js";

type Projects = DelegationServiceOptions["projects"];

/**
 * Where a new root session of `account` works. The owner and administrators may pick any existing readable
 * directory (a registered project's directory is placed in that project); every other account only a
 * directory inside a project granted to it, a linked git worktree of such a project included.
 */
export async function rootPlacement(
  account: Account,
  cwd: string,
  projects: Projects,
): Promise<WorkDirPlacement> {
  const projectForPath = projects?.projectForPath;
  if (account.isOwner || account.isAdministrator)
    return delegatedWorkDir(cwd, {
      kind: "admin",
      canExecuteHost: true,
      ...(projectForPath && { projectForPath }),
    });
  const refused = (why: string) =>
    new DelegatedScopeError("work_dir_not_permitted", `working directory refused: ${why}`, { cwd });
  if (!projectForPath || !projects?.grantedTo) throw refused("this host has no projects to grant");
  const probe = await delegatedWorkDir(cwd, { kind: "admin", canExecuteHost: true, projectForPath });
  let project = probe.projectRef ? await projects.rootOf?.(probe.projectRef) : undefined;
  if (!project) {
    const context = await projectContextRoot(probe.workDir);
    if (context) project = await projectForPath(context.repositoryRoot);
  }
  if (!project || !(await projects.grantedTo(account.id, project.ref)))
    throw refused(`${probe.workDir} is not inside a project granted to this account`);
  return delegatedWorkDir(probe.workDir, { kind: "scoped", project });
}

/**
 * The host's own directories (the daemon's data directory, with its tokens and password) are never an
 * agent's: a working directory may not contain one, nor lie inside one, except where the host keeps
 * agents' own work (its isolated worktrees).
 */
export function assertNotHostPrivate(
  workDir: string,
  hostPrivate: readonly { readonly path: string; readonly agentsMayUse?: readonly string[] }[] | undefined,
): void {
  for (const p of hostPrivate ?? []) {
    const holds = posixInside(workDir, p.path);
    const within =
      posixInside(p.path, workDir) && !(p.agentsMayUse ?? []).some((a) => posixInside(a, workDir));
    if (holds || within)
      throw new DelegatedScopeError(
        "work_dir_not_permitted",
        `working directory refused: ${workDir} ${holds ? "holds" : "is inside"} the daemon's own data directory`,
        { cwd: workDir },
      );
  }
}

/** A child's requested `cwd` read against its parent's: relative to the parent's directory, else inherited. */
export function childCwd(
  parent: DelegatedExecutionScope | null,
  requested: string | null | undefined,
): string | null {
  const base = parent?.workDir ?? null;
  if (requested === undefined || requested === null || requested === "") return base;
  if (isAbsolute(requested) || base === null || parent?.target.kind !== "host") return requested;
  return resolve(base, requested);
}

/**
 * The directory work under `scope` stays inside, on this host: its registered project's root when it is
 * placed in one, else the git repository around its directory, else that directory itself. Null: the scope
 * has no directory, or works on another machine (a managed guest, a paired computer).
 */
export async function projectBoundOf(
  scope: DelegatedExecutionScope | null,
  projects: Projects,
): Promise<string | null> {
  if (!scope?.workDir || scope.target.kind !== "host") return null;
  const registered = scope.projectRef ? await projects?.rootOf?.(scope.projectRef) : undefined;
  if (registered) return registered.root;
  const context = await projectContextRoot(scope.workDir);
  return context?.repositoryRoot ?? scope.workDir;
}

/**
 * A child stays inside its parent's project: the registered project's root when the parent is placed in
 * one, else the git repository around the parent's directory, else that directory itself. A linked git
 * worktree of the same repository counts as inside (an isolated child works in one).
 */
export async function assertInsideParentProject(
  parent: DelegatedExecutionScope | null,
  child: WorkDirPlacement,
  projects: Projects,
): Promise<void> {
  if (child.target.kind !== "host") return;
  const bound = await projectBoundOf(parent, projects);
  if (bound === null) return;
  if (posixInside(bound, child.workDir)) return;
  const childContext = await projectContextRoot(child.workDir);
  if (childContext && posixInside(bound, childContext.repositoryRoot)) return;
  throw new DelegatedScopeError(
    "work_dir_outside_project",
    `working directory refused: ${child.workDir} is outside the parent's project (${bound})`,
    { cwd: child.workDir, project: bound },
  );
}

/**
 * The live placement policy of a caller with this authority: a paired computer, a managed guest, a host
 * project it is bound to, or (for operators, and for a nameless host target) any host directory.
 */
export async function workDirPolicyFor(
  authority: { operator?: boolean; target: ExecutionTarget },
  projects: Projects,
  unregistered: (ref: string) => Error,
): Promise<WorkDirPolicy> {
  const target = authority.target;
  const projectForPath = projects?.projectForPath;
  const admin: WorkDirPolicy = {
    kind: "admin",
    canExecuteHost: authority.operator === true,
    ...(projectForPath ? { projectForPath } : {}),
  };
  switch (target.kind) {
    case "local":
      return { kind: "local", targetId: target.targetId };
    case "managed":
      return { kind: "managed", ref: target.ref, guestRoot: target.root };
    case "host": {
      if (target.ref === null) return admin;
      const project: HostProject | undefined = await projects?.rootOf?.(target.ref);
      if (project) return { kind: "scoped", project };
      if (authority.operator) return admin;
      throw unregistered(target.ref);
    }
  }
}
