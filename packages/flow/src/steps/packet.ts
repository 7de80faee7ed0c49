import { join } from "node:path";
import { overlayForPacket, type RoleName, WRITING_ROLES } from "../run/roles.js";

/**
 * The task packet: everything the subagent needs, self-contained, in this order: where it works, the
 * repository tools (TMPDIR first, then go), the role's overlay, the earlier attempts, the task (or, for a
 * repair, the task once, the answer repaired and the repair instruction) and the output contract.
 */
export interface PacketInput {
  marker: string;
  role: RoleName;
  workspace: string;
  overlay: string;
  /** The TMPDIR run.json records (env.TMPDIR), and where it is recorded; absent for a spec without env. */
  tmpdir: { dir: string; specPath: string } | null;
  /** verifier.go_root and the file that sets it. */
  goRoot: { dir: string; source: string } | null;
  earlierAttempts: string[];
  task: string;
  repair: { answer: string; errors: string[] } | null;
  schema: Record<string, unknown> | null;
}

export interface RepositoryTools {
  prefix: string;
  entries: Array<[string, string]>;
  facts: string[];
}

/** The tools section's parts: TMPDIR first in the prefix and the entries, then go's. Null with neither. */
export function repositoryTools(
  tmpdir: PacketInput["tmpdir"],
  goRoot: PacketInput["goRoot"],
): RepositoryTools | null {
  if (!tmpdir && !goRoot) return null;
  const prefix: string[] = [];
  const entries: Array<[string, string]> = [];
  const facts: string[] = [];
  if (tmpdir) {
    facts.push(
      `The run's temporary directory is ${tmpdir.dir} (env.TMPDIR of ${tmpdir.specPath}); temporary files go there.`,
    );
    prefix.push(`TMPDIR=${tmpdir.dir}`);
    entries.push(["TMPDIR", tmpdir.dir]);
  }
  if (goRoot) {
    facts.push(
      `The repository's go is ${join(goRoot.dir, "bin", "go")} (verifier.go_root, set in ${goRoot.source}).`,
    );
    prefix.push(`PATH=${goRoot.dir}/bin:"$PATH"`, `GOROOT=${goRoot.dir}`, "GOTOOLCHAIN=local");
    entries.push(["PATH", `${goRoot.dir}/bin:$PATH`], ["GOROOT", goRoot.dir], ["GOTOOLCHAIN", "local"]);
  }
  return { prefix: prefix.join(" "), entries, facts };
}

export function buildPacket(p: PacketInput): string {
  const out: string[] = [`# Task packet ${p.marker}`, "", "## Where you work", ""];
  out.push(
    `Your workspace is ${p.workspace}. Work only under this absolute path: run every command with workdir ${p.workspace} and edit only by absolute paths under it.`,
  );
  if (!WRITING_ROLES.has(p.role)) out.push(`Your role (${p.role}) writes nothing: change nothing anywhere.`);
  out.push("Nobody runs git commit, git add, git branch, git reset or git checkout.", "");
  const tools = repositoryTools(p.tmpdir, p.goRoot);
  if (tools) {
    out.push("## Repository tools", "", ...tools.facts.map((f) => `- ${f}`));
    out.push(
      "",
      "Put this prefix in front of every command you run (your shell is not configured for this run):",
      "",
      "```",
      tools.prefix,
      "```",
      "",
      "Environment entries, in order:",
      "",
      ...tools.entries.map(([k, v]) => `- ${k}=${v}`),
      "",
    );
  }
  out.push(`## Role: ${p.role}`, "", overlayForPacket(p.overlay), "");
  if (p.earlierAttempts.length > 0) {
    out.push("## Earlier attempts", "", ...p.earlierAttempts.map((a) => `- ${a}`), "");
  }
  out.push("## Task", "", p.task, "");
  if (p.repair) {
    out.push(
      "## Repair",
      "",
      "An earlier answer to this task did not satisfy the output contract. The answer was:",
      "",
      "```",
      p.repair.answer,
      "```",
      "",
      "What was wrong with it:",
      "",
      ...p.repair.errors.map((e) => `- ${e}`),
      "",
      "Answer again: your final message must satisfy the output contract below.",
      "",
    );
  }
  out.push("## Output contract", "", "Your final message is exactly one JSON object and nothing else.");
  if (p.schema) {
    out.push(
      "It must be valid against this JSON Schema:",
      "",
      "```json",
      JSON.stringify(p.schema, null, 2),
      "```",
    );
  }
  out.push("");
  return out.join("\n");
}

/** The input of a repair turn sent to the open subagent (after the marker line). */
export function repairInput(answer: string, errors: string[]): string {
  return [
    "Your final message did not satisfy the output contract of your task packet:",
    ...errors.map((e) => `- ${e}`),
    "",
    `Your answer was: ${answer.length > 2000 ? `${answer.slice(0, 2000)}…` : answer}`,
    "",
    "Answer again with exactly the JSON object the packet names, and nothing else.",
  ].join("\n");
}
