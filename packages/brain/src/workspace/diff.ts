import { git, nulFields } from "./git.js";

/**
 * What changed between two commits, for a caller to show what a child did or what landed. Plumbing
 * (`diff-tree`), not `git diff`: the user's diff settings (renames, external drivers) change nothing here.
 * Renames are reported as a deletion and an addition, so every path named is a path of one side.
 */
export type ChangedFileStatus = "added" | "modified" | "deleted" | "type_changed";

export interface DiffStatFile {
  path: string;
  status: ChangedFileStatus;
  /** Lines added and removed; null for a binary file. */
  insertions: number | null;
  deletions: number | null;
}

export interface DiffStat {
  from: string;
  to: string;
  files: DiffStatFile[];
  insertions: number;
  deletions: number;
  /** git's own wording: `3 files changed, 10 insertions(+), 2 deletions(-)`. */
  summary: string;
}

const TREE_DIFF = ["diff-tree", "-r", "--no-renames", "--no-textconv", "-z"];

/** The paths that differ between two commits, sorted. */
export async function changedPaths(repoDir: string, from: string, to: string): Promise<string[]> {
  if (from === to) return [];
  const out = await git(repoDir, [...TREE_DIFF, "--name-only", from, to, "--"]);
  return nulFields(out).sort();
}

const STATUS: Readonly<Record<string, ChangedFileStatus>> = {
  A: "added",
  M: "modified",
  D: "deleted",
  T: "type_changed",
};

export async function diffStat(repoDir: string, from: string, to: string): Promise<DiffStat> {
  const statuses = nulFields(await git(repoDir, [...TREE_DIFF, "--name-status", from, to, "--"]));
  const numstat = nulFields(await git(repoDir, [...TREE_DIFF, "--numstat", from, to, "--"]));
  const counts = new Map<string, [number | null, number | null]>();
  for (const line of numstat) {
    // "<added>\t<deleted>\t<path>", with "-" for both counts of a binary file
    const [added, deleted, ...path] = line.split("\t");
    const count = (n: string | undefined) => (n === undefined || n === "-" ? null : Number(n));
    counts.set(path.join("\t"), [count(added), count(deleted)]);
  }
  const files: DiffStatFile[] = [];
  for (let i = 0; i + 1 < statuses.length; i += 2) {
    const path = statuses[i + 1] as string;
    const [insertions, deletions] = counts.get(path) ?? [null, null];
    files.push({
      path,
      status: STATUS[(statuses[i] as string)[0] ?? ""] ?? "modified",
      insertions,
      deletions,
    });
  }
  files.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  const insertions = files.reduce((n, f) => n + (f.insertions ?? 0), 0);
  const deletions = files.reduce((n, f) => n + (f.deletions ?? 0), 0);
  return { from, to, files, insertions, deletions, summary: summarize(files.length, insertions, deletions) };
}

function summarize(files: number, insertions: number, deletions: number): string {
  const plural = (n: number, one: string, many: string) => `${n} ${n === 1 ? one : many}`;
  const parts = [plural(files, "file changed", "files changed")];
  if (files === 0) return parts[0] as string;
  // as git words it: a count of zero is shown only when the other one is zero too
  if (insertions > 0 || deletions === 0) parts.push(`${plural(insertions, "insertion", "insertions")}(+)`);
  if (deletions > 0 || insertions === 0) parts.push(`${plural(deletions, "deletion", "deletions")}(-)`);
  return parts.join(", ");
}
