import { accessSync, constants, statSync } from "node:fs";
import { dirname, join } from "node:path";
import type { bindRunOwner } from "../bound/run.js";
import { boundDir } from "../bound/store.js";
import { BUILTIN_AGENT_TYPES, type CodexSettings } from "../run/codexConfig.js";
import { hostKind, probeHost } from "../run/hostDiagnosis.js";
import type { RunPaths } from "../run/paths.js";
import { ROLE_NAMES, type RoleTable } from "../run/roles.js";
import { unusable } from "../run/tmploc.js";

export interface SessionFact {
  fact:
    | "owner_bound"
    | "role_models"
    | "owner_state_writable"
    | "subagent_slots"
    | "multi_agent_v1"
    | "verifier_prerequisites"
    | "owner_host_reachable";
  ok: boolean;
  detail: string;
}

/**
 * The start preview's six session facts (the seventh, owner_host_reachable, is `ownerHostReachable`). Each is a warning when it does not hold, never a refusal: the
 * run starts whatever they say (the owner reads them before it takes the first step).
 */
export function sessionFacts(o: {
  owner: string;
  codex: CodexSettings;
  paths: RunPaths;
  repo: string;
  table: RoleTable;
  bind: ReturnType<typeof bindRunOwner> | null;
  pool: number;
}): SessionFact[] {
  return [
    ownerBound(o.owner, o.bind),
    roleModels(o.table, o.codex),
    ownerStateWritable(o.paths, o.repo),
    subagentSlots(o.codex, o.pool),
    {
      fact: "multi_agent_v1",
      ok: !o.codex.multiAgentV2,
      detail: o.codex.multiAgentV2
        ? `features.multi_agent_v2 is on in ${o.codex.source}: under V2 the protocol stops`
        : "multi_agent v1 (features.multi_agent_v2 off)",
    },
    verifierPrerequisites(o.table),
  ];
}

function ownerBound(owner: string, bind: ReturnType<typeof bindRunOwner> | null): SessionFact {
  if (!owner) return { fact: "owner_bound", ok: false, detail: "no owner thread id" };
  if (!bind) return { fact: "owner_bound", ok: false, detail: `owner ${owner}: no binding was written` };
  if (bind.warning)
    return { fact: "owner_bound", ok: false, detail: `owner ${owner} is not bound: ${bind.warning}` };
  return { fact: "owner_bound", ok: true, detail: `owner thread ${owner} is bound to the run` };
}

/** The six pairs: a role without a model or without an effort, and an agent_type the host would refuse. */
function roleModels(table: RoleTable, codex: CodexSettings): SessionFact {
  const problems: string[] = [];
  const pairs: string[] = [];
  for (const role of ROLE_NAMES) {
    const e = table.roles[role];
    pairs.push(`${role}=${e.model ?? "undecided"}/${e.effort ?? "undecided"}`);
    if (!e.model) problems.push(`${role} has no model (the host decides)`);
    else if (!e.effort) problems.push(`${role} has no effort (the host decides)`);
    if (!BUILTIN_AGENT_TYPES.includes(e.agent_type) && !codex.agentTypes.includes(e.agent_type))
      problems.push(
        `${role} spawns as agent_type ${e.agent_type}, which the host refuses unless [agents.${e.agent_type}] is configured in ${codex.source}`,
      );
  }
  return {
    fact: "role_models",
    ok: problems.length === 0,
    detail: problems.length === 0 ? pairs.join(", ") : `${problems.join("; ")} (${pairs.join(", ")})`,
  };
}

/** The run directory, the flow-bound directory, the control socket (a unix:// host) and the repository. */
function ownerStateWritable(paths: RunPaths, repo: string): SessionFact {
  const bad: string[] = [];
  const check = (what: string, dir: string) => {
    const why = unusable(dir, what);
    if (why) bad.push(why);
  };
  check("run directory", paths.dir);
  const bound = boundDir(paths.state);
  check("flow-bound directory", existsDir(bound) ? bound : paths.state);
  check("repository", repo);
  const socket = controlSocket();
  if (socket) check("control socket directory", dirname(socket));
  return {
    fact: "owner_state_writable",
    ok: bad.length === 0,
    detail: bad.length === 0 ? `${paths.dir}, ${bound}, ${repo} are writable` : bad.join("; "),
  };
}

function controlSocket(): string | null {
  const host = process.env.CRW_FLOW_HOST ?? "";
  return host.startsWith("unix://") ? host.slice("unix://".length) : null;
}

function existsDir(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

function subagentSlots(codex: CodexSettings, pool: number): SessionFact {
  const ok = codex.maxThreads >= 2;
  return {
    fact: "subagent_slots",
    ok,
    detail: ok
      ? `agents.max_threads = ${codex.maxThreads}: pool ${pool}, one slot kept for the owner`
      : `agents.max_threads = ${codex.maxThreads} leaves no slot for a call beside the owner's own`,
  };
}

/** Judged for every run: the role store's verifier.go_root, when named, must hold an executable go. */
function verifierPrerequisites(table: RoleTable): SessionFact {
  if (!table.verifier)
    return {
      fact: "verifier_prerequisites",
      ok: true,
      detail: "no verifier.go_root in the role store: the packets name no go toolchain",
    };
  const go = join(table.verifier.go_root, "bin", "go");
  try {
    accessSync(go, constants.X_OK);
    return { fact: "verifier_prerequisites", ok: true, detail: `${go} is executable` };
  } catch {
    return {
      fact: "verifier_prerequisites",
      ok: false,
      detail: `verifier.go_root ${table.verifier.go_root}: ${go} is not an executable file`,
    };
  }
}

/**
 * The seventh fact: whether the owner's Codex host looks reachable (the default host's control socket, a
 * unix:// socket, a ws:// address that accepts a connection). A host command is not judged: only running
 * it would tell, and the run's own bound says so later.
 */
export async function ownerHostReachable(host: string): Promise<SessionFact> {
  const spec = host.trim();
  if (hostKind(spec) === "command")
    return {
      fact: "owner_host_reachable",
      ok: true,
      detail: `the host command \`${spec}\` is judged when the run first asks it`,
    };
  const d = await probeHost(host);
  if (!d)
    return {
      fact: "owner_host_reachable",
      ok: true,
      detail: `the host ${host || "codex app-server proxy"} answers`,
    };
  return {
    fact: "owner_host_reachable",
    ok: false,
    detail: `crw cannot reach ${d.host}: ${d.why}. To fix: ${d.fix}`,
  };
}
