import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { journalWakeKey, WakeHub } from "../src/wake.js";

// The hub's in-process contract, without a database: a wake between a read and the next wait is kept, a
// wake for what the view has already read is not news, and every wait ends at its bound or on abort.
describe("WakeHub", () => {
  const key = journalWakeKey("0190A5C2-0000-7000-8000-000000000001");

  it("keeps a wake that came before the wait, and ends a wait at once when woken", async () => {
    const hub = new WakeHub();
    hub.fallbackMs = 60_000;
    const w = hub.watch(key);
    hub.wake(key, 3);
    const t0 = performance.now();
    expect(await w.next()).toBe("woken");
    const waiting = w.next();
    setTimeout(() => hub.wake(journalWakeKey("0190a5c2-0000-7000-8000-000000000001"), 4), 5);
    expect(await waiting).toBe("woken");
    expect(performance.now() - t0).toBeLessThan(1_000);
    w.close();
    expect(hub.watchCount).toBe(0);
  });

  it("ignores a wake at or below what the view has seen; a wake without a seq is always news", async () => {
    const hub = new WakeHub();
    const w = hub.watch(key);
    w.seen(7);
    hub.wake(key, 7);
    expect(await w.next(undefined, 20)).toBe("fallback");
    hub.wake(key, 8);
    expect(await w.next(undefined, 20)).toBe("woken");
    hub.wake(key);
    expect(await w.next(undefined, 20)).toBe("woken");
    w.close();
  });

  it("ends a wait on abort and on the fallback bound; wakeAll wakes every view", async () => {
    const hub = new WakeHub();
    hub.fallbackMs = 30;
    const a = hub.watch(key);
    const b = hub.watch(journalWakeKey("0190a5c2-0000-7000-8000-000000000002"));
    expect(await a.next()).toBe("fallback");
    const stop = new AbortController();
    const aborted = a.next(stop.signal);
    stop.abort();
    expect(await aborted).toBe("aborted");
    hub.wakeAll();
    expect(await a.next()).toBe("woken");
    expect(await b.next()).toBe("woken");
    a.close();
    b.close();
  });

  it("without a listener it cannot tell who watches, so every key counts as watched", () => {
    const hub = new WakeHub();
    expect(hub.isWatched(key)).toBe(true);
  });
});

describe("WakeHub on a database", () => {
  const db = useTestDatabase();
  const unwatched = journalWakeKey("0190a5c2-0000-7000-8000-0000000000ff");

  it("notifies every write for a second after its listener comes up, unless the boot found it alone on the database", async () => {
    const relearning = new WakeHub();
    const alone = new WakeHub();
    try {
      relearning.attach(db.pool, () => {});
      alone.attach(db.pool, () => {});
      await alone.aloneOnDatabase();
      await expect.poll(() => relearning.counts.listens).toBe(1);
      // both listen now; only the one that cannot know who else watches counts an unwatched key as watched
      expect(alone.counts.listens).toBe(1);
      expect(relearning.isWatched(unwatched)).toBe(true);
      expect(alone.isWatched(unwatched)).toBe(false);
      // a view opened anywhere is still heard, and counts at once
      const view = relearning.watch(unwatched);
      await expect.poll(() => alone.isWatched(unwatched), { timeout: 2_000 }).toBe(true);
      view.close();
    } finally {
      await relearning.close();
      await alone.close();
    }
  });
});
