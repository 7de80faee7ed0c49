/**
 * A named crash point: `after:<row type>:<n>` kills the run process after its n-th durable row of a type;
 * `after:<row type>/<action>:<n>` counts only the rows of that type with that `action` (a step's spawn or
 * send_input), so a point in one call's path does not move when parallel calls interleave their rows.
 */
export interface FaultPoint {
  rowType: string;
  action: string | null;
  n: number;
}

export function parseFaultPoint(value: string | undefined): FaultPoint | null {
  if (!value) return null;
  const m = /^after:([a-z_]+)(?:\/([a-z_]+))?:(\d+)$/.exec(value);
  if (!m?.[1] || !m[3]) return null;
  return { rowType: m[1], action: m[2] ?? null, n: Number(m[3]) };
}

/** The counter a row advances for `fault`, or null when the row is not one it counts. */
export function faultKey(fault: FaultPoint, row: { type: string; action?: unknown }): string | null {
  if (row.type !== fault.rowType) return null;
  if (fault.action !== null && row.action !== fault.action) return null;
  return fault.action === null ? row.type : `${row.type}/${fault.action}`;
}
