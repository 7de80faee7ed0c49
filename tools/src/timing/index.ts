/**
 * Time bounds for deterministic cases (fuzz cases, worst-case inputs) that hold on a loaded machine.
 *
 * A case over its bound is run again, up to `tries` runs, and its time is the fastest run: a scheduling
 * pause or a collection on a machine running other suites lands on one run, while code that is slow by
 * its nature (a backtracking matcher, a quadratic parse) is slow on every run. Only for cases whose
 * function has no effect that a second run would see.
 */
export type Timed<T> = { outcome: { ok: T } | { error: unknown }; ms: number; runs: number };

const DEFAULT_TRIES = 3;

function once<T>(fn: () => T): { outcome: { ok: T } | { error: unknown }; ms: number } {
  const started = performance.now();
  try {
    const ok = fn();
    return { outcome: { ok }, ms: performance.now() - started };
  } catch (error) {
    return { outcome: { error }, ms: performance.now() - started };
  }
}

async function onceAsync<T>(
  fn: () => Promise<T>,
): Promise<{ outcome: { ok: T } | { error: unknown }; ms: number }> {
  const started = performance.now();
  try {
    const ok = await fn();
    return { outcome: { ok }, ms: performance.now() - started };
  } catch (error) {
    return { outcome: { error }, ms: performance.now() - started };
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
