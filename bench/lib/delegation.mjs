// The delegation service as the daemon runs it (its pool, the scripted runner, a file spill store), with
// the time from each result's settlement to its delivery into the parent recorded in `latencies` (ms), and
// apart: `metTurn` when the result settled while its parent held a turn, `idleParent` when it did not.
import { join } from "node:path";

export async function measuredDelegationService({ db, brain, url, work }) {
  // The pool the daemon runs on: each statement prepared once per connection.
  const pool = db.createPool({ connectionString: url, max: 10 });
  // An idle client dropped by the server (at shutdown) is reported, not fatal.
  pool.on("error", (e) => console.error(`pool: ${e.message}`));
  const settledAt = new Map();
  const latencies = [];
  // the same latencies, of the results that found their parent holding a turn (a follow-up's delivery and
  // turn) when they settled: they wait for it to end
  const metTurn = [];
  const idleParent = [];
  const service = new brain.DelegationService({
    repo: new db.PgDelegationRepository(pool),
    runner: brain.createScriptedTurnRunner(),
    spill: new brain.FileSpillStore(join(work, "spill")),
    onEvent: (e) => {
      if (e.type === "delegation.result_steered")
        settledAt.set(e.resultId, { at: performance.now(), met: service.turns.isBusy(e.parentSessionId) });
    },
    onResultDelivered: (e) => {
      const now = performance.now();
      for (const d of e.delivered) {
        const s = settledAt.get(d.resultId);
        if (s === undefined) continue;
        latencies.push(now - s.at);
        (s.met ? metTurn : idleParent).push(now - s.at);
      }
    },
  });
  await service.start();
  return { pool, service, latencies, metTurn, idleParent };
}
