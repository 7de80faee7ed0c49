/**
 * The crash-injection driver: the journal boundaries of a run, named as fault points the run process
 * obeys (CRW_FLOW_FAULT=after:<row type>:<n> kills it with SIGKILL right after its n-th durable row of
 * that type), and the checks a resumed run must pass against the uninterrupted one.
 */
export interface RowLike {
  type: string;
  call?: string;
  marker?: string;
  k?: number;
  attempt?: number;
}

/** Every boundary of a one-process run: after each of its rows, by type and ordinal. */
export function faultPointsOf(rows: readonly RowLike[]): string[] {
  const counts = new Map<string, number>();
  const points: string[] = [];
  for (const row of rows) {
    const n = (counts.get(row.type) ?? 0) + 1;
    counts.set(row.type, n);
    points.push(`after:${row.type}:${n}`);
  }
  return points;
}

export interface CrashCheck {
  /** Calls with more than one completed row: never allowed. */
  completedTwice: string[];
  /** Markers published by more than one step_published row: a step is published again by its files only. */
  publishedTwice: string[];
  /** Calls with more than one terminal row of any kind. */
  terminalTwice: string[];
}

export function checkResumedRun(rows: readonly RowLike[]): CrashCheck {
  const count = (pick: (r: RowLike) => string | null) => {
    const m = new Map<string, number>();
    for (const r of rows) {
      const key = pick(r);
      if (key !== null) m.set(key, (m.get(key) ?? 0) + 1);
    }
    return [...m].filter(([, n]) => n > 1).map(([k]) => k);
  };
  return {
    completedTwice: count((r) => (r.type === "completed" ? (r.call ?? "") : null)),
    publishedTwice: count((r) => (r.type === "step_published" ? (r.marker ?? "") : null)),
    terminalTwice: count((r) => (r.type === "completed" || r.type === "null_model" ? (r.call ?? "") : null)),
  };
}
