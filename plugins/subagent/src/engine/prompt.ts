import type { WorkflowNode } from "../definition/schema.js";
import type { OrchestrationJournal } from "../journal/schema.js";
import { workflowArtifactPath } from "../store/artifacts.js";

export const HANDOVER_CHARS = 1200;

/** A completed node's short handover: the head of its answer, with a pointer to the full artifact. */
export function handoverOf(reply: string): string {
  const text = reply.trim();
  return text.length <= HANDOVER_CHARS
    ? text
    : `${text.slice(0, HANDOVER_CHARS)}… (truncated; the full result is in the shared artifact)`;
}

/**
 * A node's prompt: its own task plus the short handovers of its direct dependencies only (never the
 * transcripts, never indirect upstream nodes), each with the artifact the node may read.
 */
export function nodePrompt(journal: OrchestrationJournal, node: WorkflowNode): string {
  const parts = [node.task.trim()];
  if (node.dependsOn.length > 0) {
    parts.push("", "Handovers from the nodes this one depends on:");
    for (const dep of node.dependsOn) {
      const state = journal.nodes[dep];
      const artifact = state?.artifact
        ? ` (full result: ${workflowArtifactPath(journal.workflowId, dep, state.artifact.sha256)})`
        : "";
      parts.push(`--- ${dep}${artifact}`, state?.handover ?? "(no handover)");
    }
  }
  if (node.outputSchema) {
    parts.push("", `Answer with JSON only, matching this JSON Schema: ${JSON.stringify(node.outputSchema)}`);
  }
  return parts.join("\n");
}

/** The one whole-workflow summary the parent receives: node states and handovers, never node transcripts. */
export function workflowSummary(journal: OrchestrationJournal, outcome: string, note?: string): string {
  const lines = [`Workflow "${journal.name}" (${journal.workflowId}) ${outcome}, run ${journal.run}.`];
  if (note) lines.push(note);
  for (const id of journal.order) {
    const n = journal.nodes[id];
    if (!n) continue;
    const what =
      n.status === "interrupted"
        ? "interrupted while running"
        : n.status === "cancelled"
          ? "cancelled before it started"
          : n.status === "blocked"
            ? `blocked: ${n.error?.message ?? "a dependency did not succeed"}`
            : n.status === "failed"
              ? `failed: ${n.error?.message ?? "unknown error"}`
              : n.status;
    lines.push(`- ${id}: ${what}`);
    if (n.status === "succeeded" && n.handover) {
      // a head cut short names where the whole answer is (WorkflowRead reads it)
      const whole = n.artifact
        ? ` (full result: ${workflowArtifactPath(journal.workflowId, id, n.artifact.sha256)})`
        : "";
      const head = n.handover.length > 300 ? `${n.handover.slice(0, 300)}…${whole}` : n.handover;
      lines.push(`  ${head.replace(/\n/g, "\n  ")}`);
    }
  }
  return lines.join("\n");
}
