import { describe, expect, it } from "vitest";
import { foldBranch } from "../../src/engine/branchFold.js";
import type { JournalRow } from "../../src/journal/rows.js";

const sha = (c: string) => c.repeat(40);
let seq = 0;
const row = (r: Record<string, unknown>) => ({ seq: seq++, at: "2026-12-01T00:00:00Z", ...r }) as JournalRow;
const done = (call: string, start: string, commit: string) =>
  row({
    type: "completed",
    call,
    op: call,
    k: 1,
    attempt: 1,
    result: {},
    result_digest: "d",
    raw_text: "{}",
    extracted: false,
    tokens: {},
    work: { start: sha(start), commit: sha(commit), paths: [`${call}.txt`] },
  });

describe("the run branch's fold", () => {
  it("a call's commit takes its start's place, so the branch only moves forwards while another call is still out", () => {
    const base = row({ type: "run_branch", branch: "crw/flow/r", base: sha("0"), from: "main" });
    // A and B start at the base; A lands, C starts from A's commit, then B lands, then C
    const rows = [base, done("a.1", "0", "a"), done("b.1", "0", "b"), done("c.1", "a", "c")];
    const f = foldBranch(rows);
    expect(f?.heads).toEqual([sha("c"), sha("b")]);
    // the branch went base -> a -> c: each a descendant of the one before
    expect(foldBranch(rows.slice(0, 2))?.tip).toBe(sha("a"));
    expect(foldBranch(rows.slice(0, 3))?.tip).toBe(sha("a"));
    expect(f?.tip).toBe(sha("c"));
    // the merge before the next call joins both open heads and is the tip
    const merged = foldBranch([
      ...rows,
      row({ type: "branch_merged", for_call: "d.1", heads: f?.heads, commit: sha("m") }),
    ]);
    expect(merged).toMatchObject({ heads: [sha("m")], tip: sha("m"), unmerged: null });
  });
});
