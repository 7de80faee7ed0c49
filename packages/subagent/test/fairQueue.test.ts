import { FairQueue, FairQueueInvariantError } from "@crw/subagent";
import fc from "fast-check";
import { describe, expect, it } from "vitest";

describe("FairQueue", () => {
  it("shift returns undefined only for an empty queue (S004-528)", () => {
    const q = new FairQueue<number>();
    expect(q.shift()).toBeUndefined();
    q.push("a", 1);
    expect(q.shift()).toBe(1);
    expect(q.shift()).toBeUndefined();
    expect(q.size).toBe(0);
    // A queue still holding an item never answers "empty", even when its rotation was lost.
    const holding = new FairQueue<number>();
    holding.push("a", 1);
    FairQueue.corruptForTest(holding, "lost-rotation");
    expect(() => holding.shift()).toThrow(/no lanes but size 1/);
  });

  it("serves producers in rotation and each lane FIFO (S004-529)", () => {
    const q = new FairQueue<string>();
    for (const x of ["a1", "a2", "a3"]) q.push("a", x);
    for (const x of ["b1", "b2"]) q.push("b", x);
    q.push("c", "c1");
    const out: string[] = [];
    for (let x = q.shift(); x !== undefined; x = q.shift()) out.push(x);
    expect(out).toEqual(["a1", "b1", "c1", "a2", "b2", "a3"]);
  });

  it("rotation and FIFO hold for any interleaving of several producers (property) (S004-529)", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.oneof(fc.record({ push: fc.integer({ min: 0, max: 4 }) }), fc.constant({ shift: true })),
          {
            maxLength: 200,
          },
        ),
        (ops) => {
          const q = new FairQueue<{ p: number; n: number }, number>();
          const counters = [0, 0, 0, 0, 0];
          const lastSeen = new Map<number, number>();
          let pending = 0;
          for (const op of ops) {
            if ("push" in op) {
              const n = counters[op.push] ?? 0;
              counters[op.push] = n + 1;
              q.push(op.push, { p: op.push, n });
              pending++;
            } else {
              const item = q.shift();
              if (pending === 0) {
                expect(item).toBeUndefined();
                continue;
              }
              expect(item).toBeDefined();
              pending--;
              const { p, n } = item as { p: number; n: number };
              // FIFO within a lane: strictly increasing sequence numbers per producer.
              expect(n).toBeGreaterThan(lastSeen.get(p) ?? -1);
              lastSeen.set(p, n);
            }
            expect(q.size).toBe(pending);
          }
        },
      ),
    );
  });

  it("no producer is served twice while another waits (S004-529)", () => {
    const q = new FairQueue<string>();
    for (let i = 0; i < 10; i++) q.push("busy", `busy${i}`);
    q.push("quiet", "quiet0");
    expect(q.shift()).toBe("busy0");
    expect(q.shift()).toBe("quiet0");
  });

  it("a missing or empty head lane throws instead of dropping state (S004-530)", () => {
    const empty = new FairQueue<number>();
    empty.push("a", 1);
    empty.push("b", 2);
    FairQueue.corruptForTest(empty, "empty-head");
    expect(() => empty.shift()).toThrow(FairQueueInvariantError);

    const missing = new FairQueue<number>();
    missing.push("a", 1);
    FairQueue.corruptForTest(missing, "missing-head");
    expect(() => missing.shift()).toThrow(/head lane a is missing/);
  });

  it("removeProducer and removeWhere keep the rest in order", () => {
    const q = new FairQueue<string>();
    q.push("a", "a1");
    q.push("b", "b1");
    q.push("a", "a2");
    q.push("c", "c1");
    expect(q.removeProducer("a")).toEqual(["a1", "a2"]);
    expect(q.removeWhere((x) => x === "c1")).toEqual(["c1"]);
    expect(q.size).toBe(1);
    expect(q.shift()).toBe("b1");
    expect(q.shift()).toBeUndefined();
  });
});
