import { gitRun } from "../git/exec.js";
import type { JournalRow, NewRow } from "../journal/rows.js";
import { type BranchFold, callRef, foldBranch, runBranchName } from "./branchFold.js";
import type { FlowEvent } from "./runContext.js";

/**
 * A run's branch `crw/flow/<run>` in its repository: made at the commit the run started on, moved to each
 * executor call's commit, and to the merge of parallel calls' commits before the next call starts. The
 * rows decide where every ref is (`foldBranch`); `sync` moves the refs there, only ever forwards and by a
 * compare-and-swap, so a resumed process repairs what a dead one left half-done and never forces a ref.
 */
export interface BranchHost {
  readonly runId: string;
  readonly repo: string;
  rows(): readonly JournalRow[];
  append(rows: NewRow[]): JournalRow[];
  emit(event: FlowEvent): void;
}

export type CallStart = { ok: true; start: string } | { ok: false; start: string; paths: string[] };

export class RunBranch {
  private queue: Promise<unknown> = Promise.resolve();
  /** Refs this process has seen at (or moved to) a commit: a sync reads only the others. */
  private readonly known = new Map<string, string>();

  private constructor(private readonly host: BranchHost) {}

  /**
   * The run's branch, or null when the repository is no git checkout with a commit (calls then work in
   * scratch directories). The first process records the branch at the repository's HEAD.
   */
  static async open(host: BranchHost): Promise<RunBranch | null> {
    if (!foldBranch(host.rows())) {
      const head = await gitRun(host.repo, ["rev-parse", "--verify", "-q", "HEAD^{commit}"]);
      if (head.code !== 0) return null;
      const from = await gitRun(host.repo, ["symbolic-ref", "-q", "--short", "HEAD"]);
      host.append([
        {
          type: "run_branch",
          branch: runBranchName(host.runId),
          base: head.stdout.trim(),
          from: from.code === 0 ? from.stdout.trim() : null,
        },
      ]);
    }
    const branch = new RunBranch(host);
    await branch.sync();
    return branch;
  }

  fold(): BranchFold {
    const f = foldBranch(this.host.rows());
    if (!f) throw new Error("the run has no branch row");
    return f;
  }

  /** One move of the branch at a time: two calls starting at once must not both merge. */
  private serial<T>(work: () => Promise<T>): Promise<T> {
    const next = this.queue.then(work, work);
    this.queue = next.catch(() => {});
    return next;
  }

  /**
   * The commit a new call's checkout starts from: the branch's tip, after merging the open heads when
   * parallel calls left more than one. A conflict answers the paths; nothing is merged then.
   */
  startFor(call: string): Promise<CallStart> {
    return this.serial(async () => {
      const merged = await this.mergeHeads(call);
      if (!merged.ok) return merged;
      await this.syncNow();
      return merged;
    });
  }

  /** At the run's end: the open heads merged, or the conflict recorded; the refs where the rows say. */
  end(): Promise<void> {
    return this.serial(async () => {
      const merged = await this.mergeHeads(null);
      if (!merged.ok) {
        const f = this.fold();
        const last = f.unmerged;
        if (!last || last.heads.join() !== f.heads.join())
          this.host.append([{ type: "branch_unmerged", heads: f.heads, paths: merged.paths }]);
      }
      await this.syncNow();
    });
  }

  private async mergeHeads(forCall: string | null): Promise<CallStart> {
    const f = this.fold();
    if (f.heads.length < 2) return { ok: true, start: f.tip };
    const labels = new Map(f.commits.map((c) => [c.commit, c.call]));
    const { combineCommits } = await import("@crw/brain");
    const heads = [...f.heads];
    const message = `crw flow: merge ${heads.map((h) => labels.get(h) ?? h.slice(0, 12)).join(", ")}${forCall ? ` for ${forCall}` : ""}\n\nrun ${this.host.runId}`;
    try {
      const m = await combineCommits(
        this.host.repo,
        heads.map((h) => ({ commit: h, label: labels.get(h) ?? h })),
        message,
      );
      this.host.append([{ type: "branch_merged", for_call: forCall, heads, commit: m.commit }]);
      return { ok: true, start: m.commit };
    } catch (e) {
      const err = e as { name?: string; code?: string; context?: { paths?: string[] } };
      if (err.name === "WorkspaceError" && err.code === "merge_conflict") {
        const paths = err.context?.paths ?? [];
        return { ok: false, start: f.tip, paths };
      }
      throw e;
    }
  }

  /** Moves the refs to where the rows say (after a call's completed row, and when a process starts). */
  sync(): Promise<void> {
    return this.serial(() => this.syncNow());
  }

  private async syncNow(): Promise<void> {
    const f = this.fold();
    for (const c of f.commits) await this.keepRef(callRef(this.host.runId, c.call), c.commit);
    await this.keepRef(`refs/heads/${f.branch}`, f.tip);
  }

  /** Creates the ref against no ref, or moves it forwards from what it holds; anything else is a warning. */
  private async keepRef(ref: string, commit: string): Promise<void> {
    const known = this.known.get(ref);
    if (known === commit) return;
    // the rows only move a ref forwards: a call's ref is made against no ref, the branch moves from the
    // commit this process saw, each in one compare-and-swap; one that fails is read in full
    const expected = known ?? (ref.startsWith("refs/heads/") ? undefined : "");
    if (expected !== undefined) {
      const args = ["update-ref", "-m", `crw flow ${this.host.runId}`, ref, commit, expected];
      if ((await gitRun(this.host.repo, args)).code === 0) {
        this.known.set(ref, commit);
        return;
      }
    }
    if (await this.moveRef(ref, commit)) this.known.set(ref, commit);
  }

  /** Reads the ref and moves it forwards; answers whether it is at `commit` now. */
  private async moveRef(ref: string, commit: string): Promise<boolean> {
    const cur = await gitRun(this.host.repo, ["rev-parse", "-q", "--verify", `${ref}^{commit}`]);
    const current = cur.code === 0 ? cur.stdout.trim() : null;
    if (current === commit) return true;
    const warn = (why: string) => {
      this.host.emit({
        type: "warning",
        message: `${ref} is at ${current ?? "no commit"}: ${why}; left as it is`,
      });
      return false;
    };
    if (current !== null) {
      const ff = await gitRun(this.host.repo, ["merge-base", "--is-ancestor", current, commit]);
      if (ff.code !== 0) return warn(`not an ancestor of ${commit}, it was moved outside the run`);
    }
    const args = ["update-ref", "-m", `crw flow ${this.host.runId}`, ref, commit, current ?? ""];
    if ((await gitRun(this.host.repo, args)).code === 0) return true;
    return warn(`it moved while crw moved it to ${commit}`);
  }
}
