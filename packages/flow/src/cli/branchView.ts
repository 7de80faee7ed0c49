import { foldBranch } from "../engine/branchFold.js";
import { gitRun } from "../git/exec.js";
import type { JournalRow } from "../journal/rows.js";

/** What `crw flow show` tells of a run's branch: the rows' account, and whether it has landed. */
export interface BranchView {
  name: string;
  base: string;
  from: string | null;
  tip: string;
  /** More than one: parallel calls' commits not merged yet (the next call or the run's end merges them). */
  heads: string[];
  commits: Array<{ call: string; role: string | null; commit: string; paths: string[] }>;
  merges: Array<{ for_call: string | null; heads: string[]; commit: string }>;
  unmerged: { heads: string[]; paths: string[] } | null;
  /** The branch's tip is in the branch the run started from (`crw flow land` brought it there). */
  landed: boolean;
}

export async function branchView(rows: readonly JournalRow[], repo: string): Promise<BranchView | null> {
  const f = foldBranch(rows);
  if (!f) return null;
  // a repository that is gone (or no git at all) shows the rows' account, not landed
  const ancestor = await gitRun(repo, ["merge-base", "--is-ancestor", f.tip, `refs/heads/${f.from}`]).catch(
    () => ({ code: 1 }),
  );
  const landed = f.from !== null && f.tip !== f.base && ancestor.code === 0;
  return {
    name: f.branch,
    base: f.base,
    from: f.from,
    tip: f.tip,
    heads: f.heads,
    commits: f.commits.map((c) => ({ call: c.call, role: c.role, commit: c.commit, paths: c.paths })),
    merges: f.merges.map((m) => ({ for_call: m.forCall, heads: m.heads, commit: m.commit })),
    unmerged: f.unmerged,
    landed,
  };
}

export function branchLines(b: BranchView): string[] {
  const short = (c: string) => c.slice(0, 12);
  return [
    `  branch ${b.name} at ${short(b.tip)} (from ${b.from ?? "a detached HEAD"} at ${short(b.base)})${b.landed ? `, landed in ${b.from}` : ""}`,
    ...b.commits.map(
      (c) => `    ${short(c.commit)} ${c.call} (${c.role ?? "?"}): ${c.paths.join(", ") || "no paths"}`,
    ),
    ...b.merges.map(
      (m) =>
        `    ${short(m.commit)} merge of ${m.heads.map(short).join(", ")}${m.for_call ? ` for ${m.for_call}` : ""}`,
    ),
    ...(b.heads.length > 1 ? [`    open heads: ${b.heads.map(short).join(", ")}`] : []),
    ...(b.unmerged ? [`    unmerged: ${b.unmerged.paths.join(", ")} conflict`] : []),
  ];
}
