/** A named crash point: `after:<row type>:<n>` kills the run process after its n-th durable row of a type. */
export interface FaultPoint {
  rowType: string;
  n: number;
}

export function parseFaultPoint(value: string | undefined): FaultPoint | null {
  if (!value) return null;
  const m = /^after:([a-z_]+):(\d+)$/.exec(value);
  if (!m?.[1] || !m[2]) return null;
  return { rowType: m[1], n: Number(m[2]) };
}
