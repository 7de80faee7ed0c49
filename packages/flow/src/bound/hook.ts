import { closeSync, openSync, readSync } from "node:fs";
import { asError } from "./errors.js";
import { appendLedger, ledgerLine } from "./ledger.js";
import { decideSpawn, hookOutput, isSpawnTool, parseHookInput, type SpawnDecision } from "./spawn.js";
import { readBinding } from "./store.js";

/**
 * `crw flow hook pre-tool-use`: one PreToolUse call. Runs on every spawn of every session of the
 * CODEX_HOME it is installed in, so it is quick and it never stands in a spawn's way for a failure of its
 * own: a session whose thread is bound to no run, a binding that cannot be trusted (read as none, with a
 * stderr warning) and a ledger that cannot be written (the spawn is decided all the same, and stderr says
 * so) leave the owner's spawns to the host. Only the two refusals of the table refuse.
 */
export interface HookResult {
  /** What the hook prints on stdout ("" leaves the tool call as it was sent). */
  stdout: string;
  stderr: string[];
  exitCode: number;
  decision: SpawnDecision | null;
}

/**
 * Whether the spawning thread is a subagent: its transcript (the rollout) starts with a session_meta line
 * whose source is a subagent's thread spawn. Read from the first bytes only (the meta's source members come
 * before the long instructions). A transcript that cannot be read is no evidence of a leaf.
 */
export function transcriptIsSubagent(path: string | undefined): boolean {
  if (!path) return false;
  let head: string;
  try {
    const fd = openSync(path, "r");
    try {
      const buf = Buffer.alloc(16_384);
      const n = readSync(fd, buf, 0, buf.length, 0);
      head = buf.subarray(0, n).toString("utf8");
    } finally {
      closeSync(fd);
    }
  } catch {
    return false;
  }
  const first = head.split("\n", 1)[0] ?? "";
  if (!first.includes('"session_meta"')) return false;
  return /"thread_source"\s*:\s*"subagent"/.test(first) || /"source"\s*:\s*\{\s*"subagent"/.test(first);
}

export function runPreToolUse(stdinText: string, options: { state: string; now?: Date }): HookResult {
  const stderr: string[] = [];
  let input: ReturnType<typeof parseHookInput>;
  try {
    input = parseHookInput(stdinText);
  } catch (e) {
    return {
      stdout: "",
      stderr: [`crw flow hook: ${asError(e).message}; the tool call is left to the host`],
      exitCode: 1,
      decision: null,
    };
  }
  if (!isSpawnTool(input.tool_name)) return { stdout: "", stderr, exitCode: 0, decision: null };
  const binding = readBinding(options.state, input.session_id);
  if (binding.warning) stderr.push(`crw flow hook: ${binding.warning}; no spawn is decided by it`);
  if (!binding.line) return { stdout: "", stderr, exitCode: 0, decision: null };
  const decision = decideSpawn(input, binding.line, {
    spawnedBySubagent: transcriptIsSubagent(input.transcript_path),
  });
  try {
    appendLedger(
      options.state,
      ledgerLine(decision, {
        owner: input.session_id,
        runId: binding.line.run_id,
        policyDigest: binding.line.policyDigest,
        ...(input.tool_use_id ? { toolUseId: input.tool_use_id } : {}),
        ...(input.turn_id ? { turnId: input.turn_id } : {}),
        ...(options.now ? { at: options.now } : {}),
      }),
    );
  } catch (e) {
    stderr.push(
      `crw flow hook: the ledger of ${input.session_id} cannot be written (${asError(e).message}); the spawn is ${decision.decision === "deny" ? "refused by its rule" : "allowed"} all the same`,
    );
  }
  const out = hookOutput(decision);
  return { stdout: out ? `${JSON.stringify(out)}\n` : "", stderr, exitCode: 0, decision };
}
