import { createHash } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { GitWorkspaceError, git, gitRun } from "./exec.js";

/**
 * Write isolation is recorded, never enforced (the host gives a subagent its parent's sandbox). With
 * SessionConfig.Trace the run takes three digests when it binds a call's subagent and when it harvests:
 *
 *   workspace  P's `git status --porcelain` and HEAD. The content of every path the status lists is
 *              hashed in too, so a second edit of a file already dirty at the bind is seen.
 *   outside    the same of the owner's working directory, when it is a git checkout other than P's.
 *   shared     the refs under refs/crw/ of the run's repository other than the run's own
 *              refs/crw/flow/<run>/ (the run moves those itself), and the binding files of the flow-bound
 *              directory, leaving out the hook's ledger (decisions/) and claims (claims/): the owner's
 *              spawns write those while a subagent works.
 *
 * A difference between the two is a flow warning: read_role_wrote (a role that changes nothing changed its
 * workspace or the owner's checkout), executor_wrote_outside, shared_state_changed.
 */
export interface TraceDigests {
  workspace: string | null;
  outside: string | null;
  shared: string;
}

export type TraceWarningKind = "read_role_wrote" | "executor_wrote_outside" | "shared_state_changed";

export interface TraceWarning {
  warning: TraceWarningKind;
  /** Which digests differ. */
  changed: Array<"workspace" | "outside" | "shared">;
  at_bind: Partial<TraceDigests>;
  at_harvest: Partial<TraceDigests>;
}

const sha = (text: string | Buffer) => createHash("sha256").update(text).digest("hex");

async function toplevel(dir: string): Promise<string | null> {
  const r = await gitRun(dir, ["rev-parse", "--show-toplevel"]).catch(() => null);
  return r && r.code === 0 ? resolve(r.stdout.trim()) : null;
}

/** HEAD, the porcelain status (untracked files listed one by one) and the content of each listed path. */
export async function checkoutDigest(dir: string): Promise<string> {
  const head = await gitRun(dir, ["rev-parse", "-q", "--verify", "HEAD"]);
  // not trimmed: a porcelain entry starts with its status columns, a space among them
  const run = await gitRun(dir, [
    "status",
    "--porcelain=v1",
    "-z",
    "--untracked-files=all",
    "--ignore-submodules=none",
  ]);
  if (run.code !== 0)
    throw new GitWorkspaceError("git_failed", `git status failed in ${dir}: ${run.stderr.trim()}`);
  const status = run.stdout;
  const hash = createHash("sha256");
  hash.update(`head ${head.code === 0 ? head.stdout.trim() : "(none)"}\0`);
  hash.update(status);
  const entries = status.split("\0").filter((e) => e.length > 3);
  const paths: string[] = [];
  for (let i = 0; i < entries.length; i++) {
    const entry = entries[i] as string;
    paths.push(entry.slice(3));
    // a rename or copy entry is followed by its source path
    if (entry[0] === "R" || entry[0] === "C") i++;
  }
  const top = (await toplevel(dir)) ?? dir;
  for (const path of paths.sort()) {
    let content: string;
    try {
      content = sha(readFileSync(join(top, path)));
    } catch {
      content = "(unreadable or gone)";
    }
    hash.update(`\0${path}\0${content}`);
  }
  return hash.digest("hex");
}

/** The outside digest: the owner's working directory's, when it is a git checkout other than P's. */
export async function outsideDigest(ownerCwd: string | null, workspace: string): Promise<string | null> {
  if (!ownerCwd) return null;
  const owners = await toplevel(ownerCwd);
  if (owners === null) return null;
  const ps = await toplevel(workspace);
  if (ps !== null && ps === owners) return null;
  return checkoutDigest(owners);
}

/** The shared digest: refs under refs/crw/ but the run's own, and the flow-bound binding files. */
export async function sharedDigest(options: {
  repo: string;
  runId: string;
  boundDir: string | null;
}): Promise<string> {
  const own = `refs/crw/flow/${options.runId}/`;
  const refs = (await git(options.repo, ["for-each-ref", "--format=%(refname) %(objectname)", "refs/crw/"]))
    .split("\n")
    .filter((l) => l !== "" && !l.startsWith(own))
    .sort();
  const files: string[] = [];
  if (options.boundDir) {
    let names: string[] = [];
    try {
      names = readdirSync(options.boundDir, { withFileTypes: true })
        .filter((e) => e.isFile() && e.name.endsWith(".jsonl"))
        .map((e) => e.name)
        .sort();
    } catch {
      // no flow-bound directory: no binding files
    }
    for (const name of names) {
      try {
        files.push(`${name} ${sha(readFileSync(join(options.boundDir, name)))}`);
      } catch {
        files.push(`${name} (unreadable)`);
      }
    }
  }
  return sha(`refs\n${refs.join("\n")}\nbound\n${files.join("\n")}`);
}

export async function takeTraceDigests(options: {
  workspace: string;
  ownerCwd: string | null;
  repo: string;
  runId: string;
  boundDir: string | null;
}): Promise<TraceDigests> {
  const [workspace, outside, shared] = await Promise.all([
    toplevel(options.workspace).then((top) => (top === null ? null : checkoutDigest(options.workspace))),
    outsideDigest(options.ownerCwd, options.workspace),
    sharedDigest(options),
  ]);
  return { workspace, outside, shared };
}

/** The flow warnings of one call from its digests at bind and at harvest. */
export function traceWarnings(options: {
  writes: boolean;
  atBind: TraceDigests;
  atHarvest: TraceDigests;
}): TraceWarning[] {
  const { atBind, atHarvest } = options;
  const differs = (k: keyof TraceDigests) => atBind[k] !== atHarvest[k];
  const pick = (d: TraceDigests, keys: Array<keyof TraceDigests>) =>
    Object.fromEntries(keys.map((k) => [k, d[k]])) as Partial<TraceDigests>;
  const out: TraceWarning[] = [];
  const add = (warning: TraceWarningKind, changed: Array<keyof TraceDigests>) => {
    if (changed.length > 0)
      out.push({ warning, changed, at_bind: pick(atBind, changed), at_harvest: pick(atHarvest, changed) });
  };
  if (options.writes) add("executor_wrote_outside", differs("outside") ? ["outside"] : []);
  else add("read_role_wrote", (["workspace", "outside"] as const).filter(differs));
  add("shared_state_changed", differs("shared") ? ["shared"] : []);
  return out;
}
