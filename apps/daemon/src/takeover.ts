import type { Logger } from "pino";

/** What one takeover pass took over, as the runtime reports it. */
export interface TakeoverPass {
  readonly delegations: {
    readonly continued: readonly string[];
    readonly settledWithoutTurn: readonly string[];
    readonly terminalized: readonly string[];
    readonly failed: readonly string[];
    readonly unknownToolCalls: number;
    /** Root parents whose interrupted tail this pass settled and whose follow-up is served here. */
    readonly roots: readonly string[];
    /** Claimed runs this pass could not recover, handed back to the next sweep. */
    readonly handedBack: readonly string[];
  };
  readonly workflows: {
    readonly resumed: readonly string[];
    readonly invalid: readonly string[];
    readonly refused: readonly string[];
  };
}

/** Whether a dead owner's runs or workflows wait (the sweep's one cheap query). */
export interface OrphanedWork {
  readonly runs: boolean;
  readonly workflows: boolean;
}

/** The takeover sweep as /health shows it: counts since start, never ids. */
export interface TakeoverHealth {
  /** The sweep's period; 0: off. */
  readonly sweepMs: number;
  /** Checks run (the cheap query), and when the last one finished. */
  readonly sweeps: number;
  readonly lastSweepAt: string | null;
  /** Recovery passes run (a check found a dead owner's work), and when the last one took something. */
  readonly passes: number;
  readonly lastTakeoverAt: string | null;
  /** How long the last pass took (claim, tails, charges, dispatch; not the continued turns). */
  readonly lastPassMs: number | null;
  /** Peers' lease releases heard (each wakes a check at once). */
  readonly releasesHeard: number;
  readonly delegations: {
    continued: number;
    settled: number;
    terminalized: number;
    failed: number;
    handedBack: number;
  };
  readonly workflows: { resumed: number; invalid: number; refused: number };
  readonly unknownToolCalls: number;
  readonly roots: number;
  readonly errors: number;
  readonly lastError: string | null;
}

export interface TakeoverSweep {
  health(): TakeoverHealth;
  /** Wakes a check now (coalesced with one already running). */
  wake(): void;
  /** A peer announced it let go of its lease: counted, and a check now. */
  released(owner: string): void;
  /** No check starts after this; resolves once a running one ended. */
  stop(): Promise<void>;
}

export interface TakeoverSweepOptions {
  readonly intervalMs: number;
  readonly probe: () => Promise<OrphanedWork>;
  readonly pass: (work: OrphanedWork) => Promise<TakeoverPass>;
  readonly log: Logger;
}

const took = (p: TakeoverPass): number =>
  p.delegations.continued.length +
  p.delegations.settledWithoutTurn.length +
  p.delegations.terminalized.length +
  p.delegations.failed.length +
  p.workflows.resumed.length +
  p.workflows.invalid.length +
  p.workflows.refused.length;

/**
 * Live takeover: every `intervalMs` one query asks whether a dead owner's work waits, and only then does a
 * recovery pass (the boot pass, restricted to dead owners) claim it. Liveness is the owner's advisory lock,
 * held as long as its connection lives, so no lease has to expire: a SIGKILLed peer's work is found at the
 * next check. Checks never overlap; a pass that took something is followed by another check at once (a
 * claim is bounded per pass), and a peer's announced release wakes one. Every wait here is the timer's.
 */
export function startTakeoverSweep(options: TakeoverSweepOptions): TakeoverSweep {
  const h = {
    sweeps: 0,
    lastSweepAt: null as string | null,
    passes: 0,
    lastTakeoverAt: null as string | null,
    lastPassMs: null as number | null,
    releasesHeard: 0,
    delegations: { continued: 0, settled: 0, terminalized: 0, failed: 0, handedBack: 0 },
    workflows: { resumed: 0, invalid: 0, refused: 0 },
    unknownToolCalls: 0,
    roots: 0,
    errors: 0,
    lastError: null as string | null,
  };
  let stopped = options.intervalMs <= 0;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> | undefined;
  let again = false;

  const record = (p: TakeoverPass) => {
    h.passes += 1;
    const d = p.delegations;
    h.delegations.continued += d.continued.length;
    h.delegations.settled += d.settledWithoutTurn.length;
    h.delegations.terminalized += d.terminalized.length;
    h.delegations.failed += d.failed.length;
    h.delegations.handedBack += d.handedBack.length;
    h.unknownToolCalls += d.unknownToolCalls;
    h.roots += d.roots.length;
    h.workflows.resumed += p.workflows.resumed.length;
    h.workflows.invalid += p.workflows.invalid.length;
    h.workflows.refused += p.workflows.refused.length;
    if (took(p) > 0) {
      h.lastTakeoverAt = new Date().toISOString();
      options.log.info(
        {
          continued: d.continued.length,
          settled: d.settledWithoutTurn.length,
          terminalized: d.terminalized.length,
          failed: d.failed.length,
          handedBack: d.handedBack.length,
          roots: d.roots.length,
          workflowsResumed: p.workflows.resumed.length,
        },
        "took over the work of a daemon that died",
      );
    }
  };

  // One check: the cheap query, and a pass only when it found a dead owner's work. True: check again now.
  const check = async (): Promise<boolean> => {
    try {
      const work = await options.probe();
      h.sweeps += 1;
      h.lastSweepAt = new Date().toISOString();
      if (!work.runs && !work.workflows) return false;
      const started = performance.now();
      const pass = await options.pass(work);
      h.lastPassMs = Math.round(performance.now() - started);
      record(pass);
      return took(pass) > 0;
    } catch (e) {
      h.errors += 1;
      h.lastError = e instanceof Error ? e.message : String(e);
      options.log.warn({ err: e }, "takeover sweep failed; the next check tries again");
      return false;
    }
  };

  const schedule = (ms: number) => {
    if (stopped) return;
    clearTimeout(timer);
    timer = setTimeout(tick, ms);
  };

  function tick(): void {
    if (stopped) return;
    if (running) {
      again = true;
      return;
    }
    again = false;
    running = check().then((more) => {
      running = undefined;
      schedule(more || again ? 0 : options.intervalMs);
    });
  }

  schedule(options.intervalMs);
  return {
    health: () => ({
      sweepMs: options.intervalMs,
      ...h,
      delegations: { ...h.delegations },
      workflows: { ...h.workflows },
    }),
    wake: () => schedule(0),
    released: () => {
      h.releasesHeard += 1;
      schedule(0);
    },
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await running;
    },
  };
}
