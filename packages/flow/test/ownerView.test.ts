import {
  appendFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import type { LightRow } from "../src/run/lightJournal.js";
import { emptyOwnerView, foldOwnerView, openCallAgents, readOwnerView } from "../src/run/ownerView.js";
import { runPaths } from "../src/run/paths.js";

// every run directory the file makes (a property test makes one a case), removed at its end
const roots: string[] = [];
const tempRoot = () => {
  const root = mkdtempSync(join(tmpdir(), "crw-owner-view-"));
  roots.push(root);
  return root;
};
afterAll(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

// a header with text of several bytes a character: offsets are in bytes
const freshRun = () => {
  const paths = runPaths(tempRoot(), "r1");
  mkdirSync(paths.dir, { recursive: true });
  const header = { journal: "crw-flow", run_id: "r1", workflow: "/tmp/é/wörk.mjs" };
  writeFileSync(paths.journal, `${JSON.stringify(header)}\n`);
  return paths;
};
const line = (r: LightRow) => `${JSON.stringify(r)}\n`;
const kept = (paths: ReturnType<typeof runPaths>) => join(paths.dir, "owner-view.json");

// rows of a few calls, each kind the view folds, in any order
const rowArb = fc.oneof(
  fc.record({
    type: fc.constantFrom("prepared", "completed", "null_model"),
    call: fc.constantFrom("c1", "c2", "c3"),
  }),
  fc.record({
    type: fc.constant("thread_started"),
    call: fc.constantFrom("c1", "c2", "c3"),
    thread_id: fc.constantFrom("t1", "t2", "t3", "t4"),
  }),
  fc.record({ type: fc.constant("session_attempt_lost"), agent_id: fc.constantFrom("t1", "t2", "t3", "t4") }),
  fc.record({ type: fc.constant("turn_started"), marker: fc.string({ maxLength: 4 }) }),
  fc.record({ type: fc.constantFrom("started", "run_paused", "run_ended", "policy_repinned") }),
  fc.record({
    type: fc.constant("decision_requested"),
    decision: fc.constantFrom("d1", "d2"),
    question: fc.string(),
  }),
  fc.record({
    type: fc.constant("flow_warning"),
    warning: fc.constantFrom("host_reachable", "host_unreachable"),
  }),
);
const rowsArb = fc
  .array(rowArb, { maxLength: 40 })
  .map((rs) => rs.map((r, i) => ({ ...r, seq: i + 1 }) as LightRow));

describe("the owner's view of a run's journal", () => {
  it("read in pieces as the journal grows, it is the fold of the whole journal, torn last lines included", () => {
    fc.assert(
      fc.property(rowsArb, fc.array(fc.nat(), { maxLength: 5 }), (rows, cuts) => {
        const paths = freshRun();
        const text = rows.map(line).join("");
        // appended in pieces cut anywhere (mid-line too: a torn last line), read after each piece
        const points = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((a, b) => a - b);
        let at = 0;
        for (const p of [...points, text.length]) {
          appendFileSync(paths.journal, text.slice(at, p));
          at = p;
          readOwnerView(paths);
        }
        const whole = foldOwnerView(emptyOwnerView(), rows);
        expect(readOwnerView(paths)).toEqual(JSON.parse(JSON.stringify(whole)));
      }),
      { numRuns: 150 },
    );
  });

  it("folds only what was appended since the kept fold, and not a torn last line until it is whole", () => {
    const paths = freshRun();
    appendFileSync(paths.journal, line({ type: "prepared", call: "c1", seq: 1 }));
    expect(Object.keys(readOwnerView(paths).calls)).toEqual(["c1"]);
    // the kept fold is what the next read starts from: a call it names stays though no row says so
    const k = JSON.parse(readFileSync(kept(paths), "utf8"));
    k.view.calls.kept = [];
    writeFileSync(kept(paths), JSON.stringify(k));
    const torn = line({ type: "prepared", call: "c2", seq: 2 });
    appendFileSync(paths.journal, torn.slice(0, 10));
    expect(Object.keys(readOwnerView(paths).calls).sort()).toEqual(["c1", "kept"]);
    appendFileSync(paths.journal, torn.slice(10));
    expect(Object.keys(readOwnerView(paths).calls).sort()).toEqual(["c1", "c2", "kept"]);
  });

  it("reads the whole journal when the kept fold is of another journal, past its end, or unreadable", () => {
    const paths = freshRun();
    appendFileSync(paths.journal, line({ type: "prepared", call: "c1", seq: 1 }));
    readOwnerView(paths);
    const k = JSON.parse(readFileSync(kept(paths), "utf8"));
    k.view.calls.stale = [];
    for (const bad of [
      { ...k, header: '{"journal":"crw-flow","run_id":"another"}' },
      { ...k, offset: k.offset + 1_000 },
      "not json",
    ]) {
      writeFileSync(kept(paths), typeof bad === "string" ? bad : JSON.stringify(bad));
      expect(Object.keys(readOwnerView(paths).calls)).toEqual(["c1"]);
    }
    // no journal: an empty view, and nothing kept for it
    const none = runPaths(tempRoot(), "r2");
    expect(readOwnerView(none)).toEqual(emptyOwnerView());
    expect(existsSync(kept(none))).toBe(false);
  });

  it("an open call's subagent is its newest thread not lost; an ended call has none", () => {
    const view = foldOwnerView(emptyOwnerView(), [
      { type: "prepared", call: "c1", seq: 1 },
      { type: "thread_started", call: "c1", thread_id: "a", seq: 2 },
      { type: "thread_started", call: "c1", thread_id: "b", seq: 3 },
      { type: "session_attempt_lost", agent_id: "b", seq: 4 },
      { type: "prepared", call: "c2", seq: 5 },
      { type: "thread_started", call: "c2", thread_id: "c", seq: 6 },
      { type: "completed", call: "c2", seq: 7 },
    ]);
    expect(openCallAgents(view)).toEqual(["a"]);
    expect(Object.keys(view.calls)).toEqual(["c1"]);
  });

  it("keeps the first request of a decision, the newest host report, the newest started, paused, ended and repin rows", () => {
    const view = foldOwnerView(emptyOwnerView(), [
      { type: "decision_requested", decision: "d1", question: "first?", options: ["a"], seq: 1 },
      { type: "decision_requested", decision: "d1", question: "again?", seq: 2 },
      {
        type: "flow_warning",
        warning: "host_unreachable",
        detail: { host: "h", why: "w", fix: "f" },
        seq: 3,
      },
      { type: "started", pid: 1, seq: 4 },
      { type: "started", pid: 2, seq: 5 },
      { type: "policy_repinned", seq: 6 },
      { type: "run_paused", reason: "held:c1", seq: 7 },
    ]);
    expect(view.decisions).toEqual({ d1: { question: "first?", options: ["a"] } });
    expect(view.hostDown).toEqual({ host: "h", why: "w", fix: "f" });
    expect([view.started?.pid, view.repinnedSeq, view.paused?.reason, view.ended]).toEqual([
      2,
      6,
      "held:c1",
      null,
    ]);
    foldOwnerView(view, [{ type: "flow_warning", warning: "host_reachable", seq: 8 }]);
    expect(view.hostDown).toBeNull();
  });
});
