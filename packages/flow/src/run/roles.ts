import { readFileSync } from "node:fs";
import { join } from "node:path";
import { canonicalJson, sha256 } from "../util/canonical.js";
import { FlowError } from "../util/errors.js";

/**
 * The role store: `<repo>/.crw/flow-roles.json`, optional. For each of the six roles a pair (model,
 * effort; either may be left out: undecided, the host decides), the agent_type the owner spawns it as, and
 * the overlay text the packet carries. `verifier.go_root` names the go the repository's tools use.
 *
 *   { "roles": { "executor": { "model": "gpt-5", "effort": "high", "overlay": "…" } },
 *     "verifier": { "go_root": "/usr/local/go" } }
 *
 * The policy digest is taken over the canonical form of the resolved table, so the same table always has
 * the same digest. Parsed by hand (no zod): `crw flow next` reads it on its fast path.
 */
export const ROLE_NAMES = ["architect", "executor", "executor-t1", "reviewer", "explorer", "critic"] as const;
export type RoleName = (typeof ROLE_NAMES)[number];

export interface RolePair {
  model: string | null;
  effort: string | null;
}

export interface RoleEntry extends RolePair {
  agent_type: string;
  overlay: string;
}

export interface RoleTable {
  roles: Record<RoleName, RoleEntry>;
  verifier: { go_root: string } | null;
  /** The file the table was read from, or null for the built-in table. */
  source: string | null;
  policy_digest: string;
}

export const ROLE_STORE_PATH = join(".crw", "flow-roles.json");

const DEFAULT_AGENT_TYPE: Record<RoleName, string> = {
  architect: "architect",
  executor: "executor",
  "executor-t1": "executor",
  reviewer: "reviewer",
  explorer: "explorer",
  critic: "reviewer",
};

const DEFAULT_OVERLAY: Record<RoleName, string> = {
  architect:
    "You design: read what exists, decide the shape of the change, and say it precisely. You write nothing.",
  executor: "You build: make the change the task asks for in your workspace, completely, and check it works.",
  "executor-t1": "You build a small, well-specified change in your workspace, and check it works.",
  reviewer: "You review: read the work named in the task and judge it against the task. You change nothing.",
  explorer:
    "You explore: find the facts the task asks for and report them with where you found them. You change nothing.",
  critic: "You criticise: find what is wrong or missing in the work named in the task. You change nothing.",
};

/** Roles that write: every other role changes nothing. */
export const WRITING_ROLES: ReadonlySet<RoleName> = new Set(["executor", "executor-t1"]);

export function isRole(value: unknown): value is RoleName {
  return typeof value === "string" && (ROLE_NAMES as readonly string[]).includes(value);
}

export function readRoleTable(repo: string): RoleTable {
  const path = join(repo, ROLE_STORE_PATH);
  let text: string | null = null;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT")
      throw new FlowError("input", `cannot read ${path}`, 2);
  }
  if (text === null) return resolveTable(undefined, null);
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new FlowError("input", `${path} is not JSON`, 2);
  }
  return resolveTable(raw, path);
}

export function resolveTable(raw: unknown, source: string | null): RoleTable {
  const where = source ?? "role store";
  const bad = (what: string): never => {
    throw new FlowError("input", `${where}: ${what}`, 2);
  };
  const o = (raw ?? {}) as Record<string, unknown>;
  if (typeof o !== "object" || Array.isArray(o)) bad("not an object");
  const rolesRaw = (o.roles ?? {}) as Record<string, unknown>;
  if (typeof rolesRaw !== "object" || Array.isArray(rolesRaw)) bad("roles is not an object");
  for (const key of Object.keys(rolesRaw)) if (!isRole(key)) bad(`unknown role '${key}'`);
  const roles = {} as Record<RoleName, RoleEntry>;
  for (const role of ROLE_NAMES) {
    const r = (rolesRaw[role] ?? {}) as Record<string, unknown>;
    for (const key of ["model", "effort", "agent_type", "overlay"]) {
      if (r[key] !== undefined && r[key] !== null && typeof r[key] !== "string")
        bad(`roles.${role}.${key} is not a string`);
    }
    const model = (r.model as string | undefined) || null;
    const effort = (r.effort as string | undefined) || null;
    if (effort && !model) bad(`roles.${role} has an effort without a model (an effort alone is no pair)`);
    roles[role] = {
      model,
      effort,
      agent_type: (r.agent_type as string | undefined) || DEFAULT_AGENT_TYPE[role],
      overlay: (r.overlay as string | undefined) ?? DEFAULT_OVERLAY[role],
    };
  }
  let verifier: RoleTable["verifier"] = null;
  if (o.verifier !== undefined) {
    const v = o.verifier as Record<string, unknown>;
    if (!v || typeof v.go_root !== "string") bad("verifier.go_root is not a string");
    verifier = { go_root: v.go_root as string };
  }
  const policy_digest = sha256(canonicalJson({ roles, verifier }));
  return { roles, verifier, source, policy_digest };
}

export function rolePairs(table: RoleTable): Record<RoleName, RolePair> {
  const out = {} as Record<RoleName, RolePair>;
  for (const role of ROLE_NAMES)
    out[role] = { model: table.roles[role].model, effort: table.roles[role].effort };
  return out;
}

/** The overlay as the packet carries it: its native-spawn section (a "## Native spawn" heading) removed. */
export function overlayForPacket(overlay: string): string {
  const lines = overlay.split("\n");
  const out: string[] = [];
  let skipping = false;
  let level = 0;
  for (const line of lines) {
    const h = /^(#+)\s+(.*)$/.exec(line);
    if (h?.[1] && h[2] !== undefined) {
      if (/^native[- ]spawn\b/i.test(h[2].trim())) {
        skipping = true;
        level = h[1].length;
        continue;
      }
      if (skipping && h[1].length <= level) skipping = false;
    }
    if (!skipping) out.push(line);
  }
  return out.join("\n").trim();
}

/** The spawn format of a role: the owner's spawn_agent call with the role's decided pair. */
export function spawnFormat(role: RoleName, entry: RoleEntry): Record<string, unknown> {
  return {
    role,
    tool: "spawn_agent",
    arguments: {
      agent_type: entry.agent_type,
      message: "<the step's message>",
      model: entry.model ?? "<host default>",
      reasoning_effort: entry.effort ?? "<host default>",
      fork_context: false,
    },
  };
}
