/**
 * Time bounds for deterministic cases (fuzz cases, worst-case inputs) that hold on a loaded machine.
 *
 * A case's time is the CPU time the process spent on it, not the clock: other suites on the same cores, or
 * a host that takes the virtual CPU away, stretch the clock of a run without adding to the work it does.
 * A case over its bound is run again, up to `tries` runs, and its time is the fastest run: a collection or
 * a compilation lands on one run, while code that is slow by its nature (a backtracking matcher, a
 * quadratic parse) is slow on every run. Only for cases whose function has no effect that a second run
 * would see.
 */
export type Timed<T> = { outcome: { ok: T } | { error: unknown }; ms: number; runs: number };

const DEFAULT_TRIES = 3;

/** The process's CPU time so far, user and system, in milliseconds. */
function cpuMs(): number {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000;
}

function once<T>(fn: () => T): { outcome: { ok: T } | { error: unknown }; ms: number } {
  const started = cpuMs();
  try {
    const ok = fn();
    return { outcome: { ok }, ms: cpuMs() - started };
  } catch (error) {
    return { outcome: { error }, ms: cpuMs() - started };
  }
}

async function onceAsync<T>(
  fn: () => Promise<T>,
): Promise<{ outcome: { ok: T } | { error: unknown }; ms: number }> {
  const started = cpuMs();
  try {
    const ok = await fn();
    return { outcome: { ok }, ms: cpuMs() - started };
  } catch (error) {
    return { outcome: { error }, ms: cpuMs() - started };
  }
}

/** Runs `fn` until one run is within `boundMs` or `tries` runs are made; the outcome is the last run's. */
export function timeWithin<T>(fn: () => T, boundMs: number, tries = DEFAULT_TRIES): Timed<T> {
  let best = Number.POSITIVE_INFINITY;
  for (let runs = 1; ; runs++) {
    const { outcome, ms } = once(fn);
    best = Math.min(best, ms);
    if (best < boundMs || runs >= tries) return { outcome, ms: best, runs };
  }
}

/** `timeWithin` for an async case. */
export async function timeWithinAsync<T>(
  fn: () => Promise<T>,
  boundMs: number,
  tries = DEFAULT_TRIES,
): Promise<Timed<T>> {
  let best = Number.POSITIVE_INFINITY;
  for (let runs = 1; ; runs++) {
    const { outcome, ms } = await onceAsync(fn);
    best = Math.min(best, ms);
    if (best < boundMs || runs >= tries) return { outcome, ms: best, runs };
  }
}
