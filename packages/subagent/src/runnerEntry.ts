import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * Which file a runner is forked from, found from this module's own location (never through PATH):
 * the packaged `runner.js` beside this module (the built package), else the source `runner.ts` beside it
 * when this process runs TypeScript through a loader that a fork inherits, else the package's built
 * `dist/runner.js` (source-mode tests and tools on plain Node, which cannot run .ts).
 */
export function resolveRunnerEntry(
  moduleUrl: string = import.meta.url,
  execArgv: readonly string[] = process.execArgv,
): string {
  const here = dirname(fileURLToPath(moduleUrl));
  const js = join(here, "runner.js");
  if (existsSync(js)) return js;
  const ts = join(here, "runner.ts");
  if (existsSync(ts) && hasTypeScriptLoader(execArgv)) return ts;
  const built = join(here, "..", "dist", "runner.js");
  if (existsSync(built)) return built;
  throw new RunnerEntryMissingError(
    `no runner entry beside ${here}: build the package (npx tsup in packages/subagent) or run with a TypeScript loader`,
  );
}

export class RunnerEntryMissingError extends Error {
  override readonly name = "RunnerEntryMissingError";
  readonly code = "runner_entry_missing";
  readonly retryable = false;
}

/** A loader that makes `node` run .ts with NodeNext specifiers (tsx, strip-types, a custom --import hook). */
export function hasTypeScriptLoader(execArgv: readonly string[]): boolean {
  return execArgv.some(
    (a, i) =>
      a.includes("tsx") ||
      a.startsWith("--experimental-strip-types") ||
      a.startsWith("--experimental-transform-types") ||
      ((a === "--import" || a === "--loader" || a === "--experimental-loader") &&
        /ts|typescript|register/i.test(execArgv[i + 1] ?? "")),
  );
}

/**
 * The flags a forked runner inherits: the parent's own (so a TypeScript loader carries over), minus the
 * `@crw/source` resolution condition, which plain Node must never receive for built JavaScript.
 */
export function runnerExecArgv(entry: string, execArgv: readonly string[] = process.execArgv): string[] {
  if (entry.endsWith(".ts")) return [...execArgv];
  const out: string[] = [];
  for (let i = 0; i < execArgv.length; i++) {
    const a = execArgv[i] as string;
    if (a === "--conditions" || a === "-C") {
      if (execArgv[i + 1] === "@crw/source") {
        i++;
        continue;
      }
    }
    if (a === "--conditions=@crw/source" || a === "-C=@crw/source") continue;
    out.push(a);
  }
  return out;
}
