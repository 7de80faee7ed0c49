import { existsSync } from "node:fs";
import { foldBranch } from "../engine/branchFold.js";
import { RunBranch } from "../engine/runBranch.js";
import { gitRun } from "../git/exec.js";
import { readJournalFile } from "../journal/journal.js";
import type { JournalRow } from "../journal/rows.js";
import { runPaths, stateDirFrom } from "../run/paths.js";
import { readSpec } from "../run/spec.js";
import { EXIT_INPUT, EXIT_OK, EXIT_REFUSED, FlowError } from "../util/errors.js";
import { parseCommand, print } from "./args.js";

/**
 * `crw flow land RUN [--into BRANCH]`: merges the run's branch into the branch the run was started from (or
 * the one named): a fast-forward when it can be, else a merge commit; never a force. A conflict, or
 * uncommitted changes the result would overwrite in the checkout of that branch, refuses with the paths
 * and changes nothing. Only an ended run lands: a running one's branch still moves. After the land the
 * run's worktrees are removed (`--keep-worktrees` keeps them).
 */
export async function landCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseCommand(
    "land",
    args,
    { state: { type: "string" }, into: { type: "string" }, "keep-worktrees": { type: "boolean" } },
    ["RUN"],
  );
  const paths = runPaths(stateDirFrom(values.state), positionals[0] as string);
  const spec = readSpec(paths.spec);
  const rows = existsSync(paths.journal) ? readJournalFile(paths.journal).rows : [];
  const fold = foldBranch(rows);
  if (!fold)
    throw new FlowError(
      "no_branch",
      `run ${spec.run_id} has no branch: ${spec.repo} is no git checkout`,
      EXIT_INPUT,
    );
  if (!rows.some((r) => r.type === "run_ended"))
    throw new FlowError(
      "run_not_ended",
      `run ${spec.run_id} has not ended; land it when it has (crw flow show ${spec.run_id})`,
      EXIT_REFUSED,
    );
  if (fold.unmerged)
    throw new FlowError(
      "merge_conflict",
      `run ${spec.run_id}'s parallel calls conflict in ${fold.unmerged.paths.join(", ")}: their commits are on refs/crw/flow/${spec.run_id}/calls/; nothing was landed`,
      EXIT_REFUSED,
      { paths: fold.unmerged.paths },
    );
  if (fold.heads.length > 1)
    throw new FlowError(
      "merge_conflict",
      `run ${spec.run_id}'s branch has parallel calls' commits that were never merged (refs/crw/flow/${spec.run_id}/calls/); nothing was landed`,
      EXIT_REFUSED,
    );
  const into = values.into ?? fold.from;
  if (!into)
    throw new FlowError(
      "input",
      `run ${spec.run_id} started on a detached HEAD: name the branch to land on with --into BRANCH`,
      EXIT_INPUT,
    );
  // a process that died after the run's last row may have left the branch behind its rows
  await RunBranch.open({
    runId: spec.run_id,
    repo: spec.repo,
    rows: () => rows,
    append: () => {
      throw new Error("land writes no journal row");
    },
    emit: (e) => process.stderr.write(`crw flow land: ${"message" in e ? e.message : e.type}\n`),
  });
  const { landBranch } = await import("@crw/brain");
  let landed: Awaited<ReturnType<typeof landBranch>>;
  try {
    landed = await landBranch({
      repoDir: spec.repo,
      branch: fold.branch,
      into,
      message: `crw flow: land run ${spec.run_id} (${spec.workflow_name})`,
    });
  } catch (e) {
    throw landRefusal(e, spec.run_id, into);
  }
  // the work is on the branch now: the calls' worktrees go, except one holding changes nobody committed
  const worktrees = values["keep-worktrees"] ? null : await removeWorktrees(spec.repo, rows);
  const view = {
    run_id: spec.run_id,
    branch: fold.branch,
    into: landed.into,
    before: landed.before,
    after: landed.after,
    fast_forward: landed.fastForward,
    already_landed: landed.alreadyLanded,
    changed_paths: landed.changedPaths,
    updated_worktree: landed.updatedWorktree,
    ...(worktrees ? { worktrees } : {}),
  };
  const how = landed.alreadyLanded ? "already in" : landed.fastForward ? "fast-forwarded" : "merged into";
  print(
    values.json,
    view,
    `${fold.branch} ${how} ${into}: ${landed.before.slice(0, 12)} -> ${landed.after.slice(0, 12)}${landed.changedPaths.length ? `\n  ${landed.changedPaths.join("\n  ")}` : ""}${worktrees ? `\n  worktrees: ${worktrees.removed} removed${worktrees.kept.length ? `, kept (uncommitted changes): ${worktrees.kept.join(", ")}` : ""}` : ""}`,
  );
  return EXIT_OK;
}

/** The workspace library's refusals, as the flow command's typed errors (exit 1: refused, nothing changed). */
function landRefusal(e: unknown, run: string, into: string): Error {
  const err = e as { name?: string; code?: string; message?: string; context?: Record<string, unknown> };
  if (err.name !== "WorkspaceError") return e as Error;
  const paths = Array.isArray(err.context?.paths) ? (err.context.paths as string[]) : [];
  switch (err.code) {
    case "merge_conflict":
      return new FlowError(
        "merge_conflict",
        `run ${run} conflicts with ${into} in ${paths.join(", ")}: nothing was landed (merge ${into} into the run's branch yourself, or land it elsewhere with --into)`,
        EXIT_REFUSED,
        { paths },
      );
    case "worktree_dirty":
      return new FlowError(
        "worktree_dirty",
        `${err.message}${paths.length ? `: ${paths.join(", ")}` : ""}; commit or stash them, then land again`,
        EXIT_REFUSED,
        { paths },
      );
    case "unknown_ref":
      return new FlowError("input", `${err.message}`, EXIT_INPUT);
    default:
      return new FlowError("land_failed", `${err.message}`, EXIT_REFUSED, err.context ?? {});
  }
}

/**
 * Removes the run's call worktrees (their registrations in the repository too). `git worktree remove`
 * without force keeps a worktree with changes nobody committed (a read role that wrote): it is listed.
 */
async function removeWorktrees(
  repo: string,
  rows: readonly JournalRow[],
): Promise<{ removed: number; kept: string[] }> {
  const out = { removed: 0, kept: [] as string[] };
  for (const r of rows) {
    if (r.type !== "prepared" || r.allocation.kind !== "worktree") continue;
    const path = r.allocation.workspace;
    if (!existsSync(path)) continue;
    const done = await gitRun(repo, ["worktree", "remove", path]);
    if (done.code === 0) out.removed++;
    else out.kept.push(path);
  }
  await gitRun(repo, ["worktree", "prune"]);
  return out;
}
