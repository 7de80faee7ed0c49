import { parseCommand, print } from "../cli/args.js";
import { loadWorkflow, runWorkflowPath } from "../engine/workflow.js";
import { readJournalFile } from "../journal/journal.js";
import { runPaths, stateDirFrom } from "../run/paths.js";
import { readSpec } from "../run/spec.js";
import { EXIT_OK, EXIT_REFUSED } from "../util/errors.js";
import { shadowReplay } from "./replay.js";

/**
 * `crw flow shadow RUN [--workflow FILE]`: replays the run from its journal without any host and reports the
 * recorded backend and every divergence. Exit 0 with none, 1 with any. `--workflow` replays another version
 * of the workflow module against the same journal (what a resume of it would find).
 */
export async function shadowCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseCommand(
    "shadow",
    args,
    { state: { type: "string" }, workflow: { type: "string" } },
    ["RUN"],
  );
  const paths = runPaths(stateDirFrom(values.state), positionals[0] as string);
  const spec = readSpec(paths.spec);
  const read = readJournalFile(paths.journal);
  const workflow = await loadWorkflow(values.workflow ?? runWorkflowPath(read.rows, spec));
  const report = await shadowReplay(spec.run_id, workflow, spec.input, read.rows);
  const human = [
    `run ${report.run_id}: backend ${report.backend ?? "(no started row)"}, recorded ${report.recorded}, replay ${report.replay}, ${report.ops_replayed} of ${report.ops_recorded} ops replayed, trace digests of ${report.trace_calls_replayed} calls judged again`,
    ...(report.divergences.length === 0
      ? ["no divergence"]
      : report.divergences.map((d) => `divergence ${d.kind}${d.op ? ` at ${d.op}` : ""}: ${d.detail}`)),
  ].join("\n");
  print(values.json, report, human);
  return report.divergences.length === 0 ? EXIT_OK : EXIT_REFUSED;
}
