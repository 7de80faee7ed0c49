import { WorkspaceError } from "./errors.js";
import { gitLine, nulFields, runGit } from "./git.js";
import { isAncestor } from "./repository.js";

/**
 * Merges as pure object writes: `git merge-tree --write-tree` computes the merged tree and `commit-tree`
 * makes the commit, so no index, working tree or ref changes until the caller moves a ref to the result.
 * A conflict is found before anything is touched, which is what lets every caller refuse without undoing.
 */

/** A commit crw makes: its identity (set on every git run), no hooks, no signing prompt. */
export async function makeCommit(
  repo: string,
  tree: string,
  parents: readonly string[],
  message: string,
): Promise<string> {
  const args = ["commit-tree", "--no-gpg-sign", tree, ...parents.flatMap((p) => ["-p", p]), "-F", "-"];
  return gitLine(repo, args, { input: message.endsWith("\n") ? message : `${message}\n` });
}

export type TreeMerge = { clean: true; tree: string } | { clean: false; paths: string[] };

/** The tree of merging two commits (their merge base found by git), or the paths that conflict. */
export async function mergeTrees(repo: string, ours: string, theirs: string): Promise<TreeMerge> {
  const args = ["merge-tree", "--write-tree", "--name-only", "--no-messages", "-z", ours, theirs];
  const r = await runGit(repo, args);
  // exit 1 is a conflict: the tree line is followed by the conflicting paths
  if (r.exitCode !== 0 && r.exitCode !== 1)
    throw new WorkspaceError("git_failed", `git merge-tree failed: ${r.stderr.trim()}`, { ours, theirs });
  const [tree, ...paths] = nulFields(r.stdout);
  if (r.exitCode === 0) return { clean: true, tree: (tree ?? "").trim() };
  return { clean: false, paths: [...new Set(paths.filter((p) => p !== ""))].sort() };
}

/** Drops every commit another one of the list contains: what remains has to be merged. */
async function tipsToMerge(repo: string, commits: readonly string[]): Promise<string[]> {
  const unique = [...new Set(commits)];
  const kept: string[] = [];
  for (const c of unique) {
    let contained = false;
    for (const other of unique)
      if (other !== c && (await isAncestor(repo, c, other))) {
        contained = true;
        break;
      }
    if (!contained) kept.push(c);
  }
  return kept;
}

export interface CombinedCommit {
  commit: string;
  /** false when one tip contained all the others (a fast-forward): no commit was made. */
  merged: boolean;
}

/**
 * One commit holding every tip: the tip that contains the others, else a merge commit whose parents are the
 * tips in the order given. More than two tips merge one after another; the intermediate commits are only
 * inputs of the next merge-tree and stay unreferenced. A conflict throws `merge_conflict` with the paths and
 * the labels of the two sides that conflicted.
 */
export async function combineCommits(
  repo: string,
  tips: ReadonlyArray<{ commit: string; label: string }>,
  message: string,
): Promise<CombinedCommit> {
  const kept = await tipsToMerge(
    repo,
    tips.map((t) => t.commit),
  );
  const [first, ...rest] = kept;
  if (first === undefined) throw new WorkspaceError("invalid_input", "nothing to merge", {});
  if (rest.length === 0) return { commit: first, merged: false };
  const labelOf = (c: string) => tips.filter((t) => t.commit === c).map((t) => t.label);
  let acc = first;
  let tree = "";
  const merged = [first];
  for (const next of rest) {
    const m = await mergeTrees(repo, acc, next);
    if (!m.clean)
      throw new WorkspaceError(
        "merge_conflict",
        `merging ${labelOf(next).join(", ")} conflicts in ${m.paths.join(", ")}`,
        {
          paths: m.paths,
          merging: [...merged.flatMap(labelOf), ...labelOf(next)],
        },
      );
    merged.push(next);
    tree = m.tree;
    if (merged.length < kept.length) acc = await makeCommit(repo, tree, merged, message);
  }
  return { commit: await makeCommit(repo, tree, kept, message), merged: true };
}
