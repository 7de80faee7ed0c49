import { readFileSync } from "node:fs";
import { FlowError } from "../util/errors.js";

/**
 * The script file of a local run on the offline `scripted` provider: per call, the replies its model gives,
 * in the order the call's conversation asks for them (the task turn first, then a repair turn if one is
 * needed). A call is looked up by its op id (`plan.1`), then by its node (`plan`), then `*`.
 *
 *   { "calls": { "plan.1": [{ "text": "{\"steps\": [\"a\"]}" }], "review": [{ "text": "…" }] } }
 *
 * Every step is one reply of `@crw/brain`'s scripted provider (text, tool calls, stop reason); the provider
 * checks the steps when it replays them.
 */
export interface LocalScript {
  calls: Record<string, unknown[]>;
}

export function readLocalScript(path: string): LocalScript {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new FlowError("input", `script ${path}: cannot read it as JSON (${(e as Error).message})`, 2);
  }
  const calls = (raw as { calls?: unknown } | null)?.calls;
  if (calls === null || typeof calls !== "object" || Array.isArray(calls)) {
    throw new FlowError("input", `script ${path}: "calls" is not an object of call ids to reply lists`, 2);
  }
  for (const [id, steps] of Object.entries(calls as Record<string, unknown>)) {
    if (!Array.isArray(steps)) throw new FlowError("input", `script ${path}: calls.${id} is not a list`, 2);
    for (const [i, s] of steps.entries()) {
      if (s === null || typeof s !== "object" || Array.isArray(s))
        throw new FlowError("input", `script ${path}: calls.${id}[${i}] is not an object`, 2);
    }
  }
  return { calls: calls as Record<string, unknown[]> };
}

/** The replies scripted for a call: by op id, then node, then `*`; none is the provider's default. */
export function scriptFor(script: LocalScript | null, call: string): unknown[] {
  if (!script) return [];
  const node = call.replace(/\.\d+$/, "");
  return script.calls[call] ?? script.calls[node] ?? script.calls["*"] ?? [];
}
