import type { JournalRow, Role as RoleName } from "../journal/rows.js";

/**
 * Where a run's branch stands, read from its rows alone (as `foldCall` reads a call's): the branch and the
 * commit it was made at, every executor call's commit, and the open heads. A call's commit replaces the
 * head it started from; two calls that started from one head leave two open heads (parallel work) until a
 * merge joins them. The branch ref points at the first open head; the others are kept on their calls' refs.
 */
export interface BranchCommit {
  call: string;
  role: RoleName | null;
  commit: string;
  parent: string;
  paths: string[];
}

export interface BranchFold {
  branch: string;
  base: string;
  /** The branch the repository had checked out when the run started (null: a detached HEAD). */
  from: string | null;
  heads: string[];
  /** heads[0]: where the branch ref points. */
  tip: string;
  commits: BranchCommit[];
  merges: Array<{ forCall: string | null; heads: string[]; commit: string }>;
  /** The run ended with heads that conflict (cleared by a later merge). */
  unmerged: { heads: string[]; paths: string[] } | null;
}

export function foldBranch(rows: readonly JournalRow[]): BranchFold | null {
  let fold: BranchFold | null = null;
  const roles = new Map<string, RoleName>();
  for (const row of rows) {
    if (row.type === "prepared") roles.set(row.call, row.role);
    if (row.type === "run_branch" && !fold) {
      fold = {
        branch: row.branch,
        base: row.base,
        from: row.from,
        heads: [row.base],
        tip: row.base,
        commits: [],
        merges: [],
        unmerged: null,
      };
    }
    if (!fold) continue;
    if (row.type === "completed" && row.work?.commit) {
      const { start, commit, paths } = row.work;
      // the commit takes its start's place (the branch moves forwards); a start another call's commit
      // already replaced leaves a second open head, merged before the next call
      const at = fold.heads.indexOf(start);
      fold.heads = at >= 0 ? fold.heads.map((h, i) => (i === at ? commit : h)) : [...fold.heads, commit];
      fold.commits.push({ call: row.call, role: roles.get(row.call) ?? null, commit, parent: start, paths });
    } else if (row.type === "branch_merged") {
      const merged = new Set(row.heads);
      fold.heads = [row.commit, ...fold.heads.filter((h) => !merged.has(h))];
      fold.merges.push({ forCall: row.for_call, heads: row.heads, commit: row.commit });
      fold.unmerged = null;
    } else if (row.type === "branch_unmerged") {
      fold.unmerged = { heads: row.heads, paths: row.paths };
    }
    fold.tip = fold.heads[0] ?? fold.base;
  }
  return fold;
}

/** The ref that keeps a call's commit reachable (and shows it) while it is an open head or after. */
export function callRef(runId: string, call: string): string {
  return `refs/crw/flow/${runId}/calls/${call}`;
}

export function runBranchName(runId: string): string {
  return `crw/flow/${runId}`;
}
