/**
 * Named fault points for crash tests, in the manner of DBOS's debug points: with `CRW_FAULT=<name>` (or
 * `<name>@<n>` for the n-th time the point is reached) the process SIGKILLs itself there. No hooks run,
 * exactly as in a real crash. Without the variable each point is one string comparison.
 */
export const FAULT_POINTS = [
  /** a child's result is committed to the inbox; delivery has not started */
  "child.settled",
  /** inside the delivery transaction: journal rows written, acknowledgements not yet */
  "delivery.between_append_and_ack",
  /** the delivery transaction committed; onResultDelivered not yet published */
  "delivery.after_commit",
  /** the settlement drain is delivering a helper result into a child whose turn ended */
  "drain.during",
  /** half of a spilled result is written, not yet synced or recorded */
  "spill.during",
  /** a tool call's intent is journaled; the tool has not run */
  "tool.after_intent",
  /** the tool ran; its result is not yet journaled */
  "tool.after_effect",
] as const;
export type FaultPoint = (typeof FAULT_POINTS)[number];

const hits = new Map<string, number>();

/**
 * `detail` narrows a point to one case (a tool name): `CRW_FAULT=tool.after_effect:Effect@2` kills at the
 * second time any Effect call has run and its result is not yet journaled.
 */
export function faultPoint(name: FaultPoint, detail?: string): void {
  const spec = process.env.CRW_FAULT;
  if (!spec) return;
  const [target = "", nth] = spec.split("@");
  const [point, wanted] = target.split(":");
  if (point !== name || (wanted !== undefined && wanted !== detail)) return;
  const count = (hits.get(target) ?? 0) + 1;
  hits.set(target, count);
  if (count >= Number(nth ?? "1")) process.kill(process.pid, "SIGKILL");
}
