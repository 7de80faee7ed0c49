import { BoundError } from "./errors.js";

/**
 * The lines of a flow-bound file (`<state>/flow-bound/<owner>.jsonl`), one JSON object a line, appended
 * only. The owner thread's binding is its LAST line: an orchestrator line binds the thread to a run, a
 * closed line (CloseOrchestrator) unbinds it.
 *
 *   {"v":1,"kind":"orchestrator","run_id":"r1","policyDigest":"…","helperPairs":{"architect":{"model":"m"},
 *    "executor":{"model":"m","effort":"high"},"executor-t1":{},"reviewer":{},"explorer":{},"critic":{}},
 *    "at":"…","pid":123}
 *   {"v":1,"kind":"closed","run_id":"r1","at":"…","reason":"run_ended"}
 *
 * A pair carries the decided parts of its role only: an undecided role has the empty pair `{}`, a role
 * that names a model and leaves its effort undecided has `{model}`. An effort without a model is no
 * role's pair, so such a line is refused. The critic is optional (a line an earlier crw wrote has none,
 * and its critic spawns are undecided); any other key (the retired role key of the crw.reviewerFinal op)
 * is read, kept in `retiredPairs`, and never applied. Parsed by hand, not with zod: the spawn hook reads
 * it on every spawn and must start fast.
 */
export const HELPER_ROLES = [
  "architect",
  "executor",
  "executor-t1",
  "reviewer",
  "explorer",
  "critic",
] as const;
export type HelperRole = (typeof HELPER_ROLES)[number];
/** The roles an orchestrator line must carry (Line.Validate): all six but the critic. */
export const REQUIRED_ROLES: readonly HelperRole[] = [
  "architect",
  "executor",
  "executor-t1",
  "reviewer",
  "explorer",
];

export interface HelperPair {
  model?: string;
  effort?: string;
}

export interface OrchestratorLine {
  v: 1;
  kind: "orchestrator";
  run_id: string;
  policyDigest: string;
  helperPairs: Partial<Record<HelperRole, HelperPair>>;
  /** Pairs of keys that are no role of the six (a retired key): read, never applied. */
  retiredPairs?: Record<string, HelperPair>;
  at: string;
  pid?: number;
}

export interface ClosedLine {
  v: 1;
  kind: "closed";
  run_id: string;
  at: string;
  reason?: string;
}

export type BoundLine = OrchestratorLine | ClosedLine;

export function isHelperRole(value: unknown): value is HelperRole {
  return typeof value === "string" && (HELPER_ROLES as readonly string[]).includes(value);
}

/** The pair a role's decided parts make: `{}`, `{model}` or `{model, effort}`. */
export function decidedPair(model: string | null | undefined, effort: string | null | undefined): HelperPair {
  if (!model) {
    if (effort)
      throw new BoundError("line_invalid", `an effort without a model ('${effort}') is no role's pair`);
    return {};
  }
  return effort ? { model, effort } : { model };
}

/** helperPairs from a role table's pairs (model/effort, null when undecided). */
export function helperPairsFrom(
  pairs: Partial<Record<HelperRole, { model: string | null; effort: string | null }>>,
): Partial<Record<HelperRole, HelperPair>> {
  const out: Partial<Record<HelperRole, HelperPair>> = {};
  for (const role of HELPER_ROLES) {
    const p = pairs[role];
    if (p) out[role] = decidedPair(p.model, p.effort);
    else if (role !== "critic") out[role] = {};
  }
  return out;
}

function validatePair(where: string, raw: unknown): HelperPair {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw))
    throw new BoundError("line_invalid", `${where} is not an object`);
  const o = raw as Record<string, unknown>;
  for (const key of Object.keys(o))
    if (key !== "model" && key !== "effort") throw new BoundError("line_invalid", `${where} has '${key}'`);
  for (const key of ["model", "effort"] as const)
    if (o[key] !== undefined && (typeof o[key] !== "string" || o[key] === ""))
      throw new BoundError("line_invalid", `${where}.${key} is not a non-empty string`);
  try {
    return decidedPair(o.model as string | undefined, o.effort as string | undefined);
  } catch (e) {
    throw new BoundError("line_invalid", `${where}: ${(e as Error).message}`);
  }
}

/**
 * Line.Validate: the line as a BoundLine, or a `line_invalid` BoundError. An orchestrator line without
 * any of architect, executor, executor-t1, reviewer, explorer is refused; the critic is optional.
 */
export function validateLine(raw: unknown): BoundLine {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw))
    throw new BoundError("line_invalid", "a flow-bound line is not an object");
  const o = raw as Record<string, unknown>;
  if (o.v !== undefined && o.v !== 1)
    throw new BoundError("line_invalid", `unknown line version ${String(o.v)}`);
  if (typeof o.run_id !== "string" || o.run_id === "")
    throw new BoundError("line_invalid", "a flow-bound line has no run_id");
  const at = typeof o.at === "string" ? o.at : "";
  if (o.kind === "closed") {
    return {
      v: 1,
      kind: "closed",
      run_id: o.run_id,
      at,
      ...(typeof o.reason === "string" ? { reason: o.reason } : {}),
    };
  }
  if (o.kind !== "orchestrator")
    throw new BoundError("line_invalid", `unknown flow-bound line kind '${String(o.kind)}'`);
  if (typeof o.policyDigest !== "string" || o.policyDigest === "")
    throw new BoundError("line_invalid", "an orchestrator line has no policyDigest");
  const rawPairs = o.helperPairs;
  if (typeof rawPairs !== "object" || rawPairs === null || Array.isArray(rawPairs))
    throw new BoundError("line_invalid", "an orchestrator line has no helperPairs");
  const pairsIn = rawPairs as Record<string, unknown>;
  const missing = REQUIRED_ROLES.filter((r) => pairsIn[r] === undefined);
  if (missing.length > 0)
    throw new BoundError(
      "line_invalid",
      `an orchestrator line without helperPairs for ${missing.join(", ")}`,
      {
        missing,
      },
    );
  const helperPairs: Partial<Record<HelperRole, HelperPair>> = {};
  const retiredPairs: Record<string, HelperPair> = {};
  for (const [key, value] of Object.entries(pairsIn)) {
    if (isHelperRole(key)) helperPairs[key] = validatePair(`helperPairs.${key}`, value);
    else retiredPairs[key] = validatePair(`helperPairs.${key}`, value);
  }
  const line: OrchestratorLine = {
    v: 1,
    kind: "orchestrator",
    run_id: o.run_id,
    policyDigest: o.policyDigest,
    helperPairs,
    at,
  };
  if (Object.keys(retiredPairs).length > 0) line.retiredPairs = retiredPairs;
  if (typeof o.pid === "number") line.pid = o.pid;
  return line;
}

/** The line as written: retired pairs go back under helperPairs, as the earlier crw wrote them. */
export function serializeLine(line: BoundLine): string {
  if (line.kind === "closed") return JSON.stringify(line);
  const { retiredPairs, ...rest } = line;
  return JSON.stringify({ ...rest, helperPairs: { ...line.helperPairs, ...(retiredPairs ?? {}) } });
}

/** The pair a spawn of `role` is decided by: the empty pair for a role the line does not carry. */
export function pairOf(line: OrchestratorLine, role: HelperRole): HelperPair {
  return line.helperPairs[role] ?? {};
}

export function samePairs(a: OrchestratorLine, b: OrchestratorLine): boolean {
  return HELPER_ROLES.every((r) => {
    const x = pairOf(a, r);
    const y = pairOf(b, r);
    return x.model === y.model && x.effort === y.effort;
  });
}
