import { parse as parseYaml } from "yaml";
import type { z } from "zod";
import { WorkflowDefinitionError } from "../errors.js";
import {
  AddedNodesSchema,
  DEFINITION_LIMITS,
  type WorkflowDefinition,
  WorkflowDefinitionSchema,
  type WorkflowNode,
} from "./schema.js";

function issues(error: z.ZodError): string {
  return error.issues
    .slice(0, 8)
    .map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`)
    .join("; ");
}

/**
 * Parses definition text (YAML, of which JSON is a subset; `format` only sharpens the error) into a
 * validated definition whose node graph is a DAG. Every refusal is a `WorkflowDefinitionError`.
 */
export function parseWorkflowDefinition(text: string, format: "yaml" | "json" = "yaml"): WorkflowDefinition {
  const bytes = Buffer.byteLength(text);
  if (bytes > DEFINITION_LIMITS.bytes) {
    throw new WorkflowDefinitionError(
      "definition_too_large",
      `workflow definition is ${bytes} bytes; the limit is ${DEFINITION_LIMITS.bytes}`,
      { bytes, limit: DEFINITION_LIMITS.bytes },
    );
  }
  let raw: unknown;
  try {
    raw =
      format === "json"
        ? JSON.parse(text)
        : parseYaml(text, { maxAliasCount: 100, uniqueKeys: true, prettyErrors: true });
  } catch (e) {
    throw new WorkflowDefinitionError(
      "definition_syntax",
      `workflow definition is not valid ${format.toUpperCase()}: ${(e as Error).message}`,
      {},
      { cause: e },
    );
  }
  return validateWorkflowDefinition(raw);
}

export function validateWorkflowDefinition(raw: unknown): WorkflowDefinition {
  const count = nodeCount(raw);
  if (count > DEFINITION_LIMITS.nodes) {
    throw new WorkflowDefinitionError(
      "too_many_nodes",
      `workflow has ${count} nodes; the limit is ${DEFINITION_LIMITS.nodes}`,
      { nodes: count, limit: DEFINITION_LIMITS.nodes },
    );
  }
  const parsed = WorkflowDefinitionSchema.safeParse(raw);
  if (!parsed.success) {
    throw new WorkflowDefinitionError(
      "definition_invalid",
      `workflow definition is invalid: ${issues(parsed.error)}`,
      {
        issues: parsed.error.issues.length,
      },
    );
  }
  checkGraph([], parsed.data.nodes);
  return parsed.data;
}

/** Validates nodes a running workflow adds: their ids are new, their dependencies exist, no cycle forms. */
export function validateAddedNodes(
  existing: readonly WorkflowNode[],
  raw: unknown,
  limit: number,
): WorkflowNode[] {
  const parsed = AddedNodesSchema.safeParse(raw);
  if (!parsed.success) {
    throw new WorkflowDefinitionError(
      "definition_invalid",
      `added nodes are invalid: ${issues(parsed.error)}`,
    );
  }
  if (existing.length + parsed.data.length > limit) {
    throw new WorkflowDefinitionError(
      "too_many_nodes",
      `the workflow would have ${existing.length + parsed.data.length} nodes; the limit is ${limit}`,
      { nodes: existing.length + parsed.data.length, limit },
    );
  }
  checkGraph(existing, parsed.data);
  return parsed.data;
}

function nodeCount(raw: unknown): number {
  if (typeof raw !== "object" || raw === null) return 0;
  const nodes = (raw as { nodes?: unknown }).nodes;
  return Array.isArray(nodes) ? nodes.length : 0;
}

/** Duplicate ids, unknown dependencies and cycles, over `existing` (already a DAG) plus `added`. */
function checkGraph(existing: readonly WorkflowNode[], added: readonly WorkflowNode[]): void {
  const ids = new Set(existing.map((n) => n.id));
  for (const node of added) {
    if (ids.has(node.id)) {
      throw new WorkflowDefinitionError("duplicate_node", `node id "${node.id}" is used twice`, {
        nodeId: node.id,
      });
    }
    ids.add(node.id);
  }
  for (const node of added) {
    for (const dep of node.dependsOn) {
      if (!ids.has(dep)) {
        throw new WorkflowDefinitionError(
          "unknown_dependency",
          `node "${node.id}" depends on "${dep}", which is not a node of this workflow`,
          { nodeId: node.id, dependency: dep },
        );
      }
      if (dep === node.id) {
        throw new WorkflowDefinitionError("dependency_cycle", `node "${node.id}" depends on itself`, {
          cycle: [node.id, node.id],
        });
      }
    }
  }
  const cycle = findCycle([...existing, ...added]);
  if (cycle) {
    throw new WorkflowDefinitionError("dependency_cycle", `dependency cycle: ${cycle.join(" -> ")}`, {
      cycle,
    });
  }
}

/** An iterative depth-first search (no recursion limit on long chains); returns one cycle's path. */
export function findCycle(nodes: readonly Pick<WorkflowNode, "id" | "dependsOn">[]): string[] | undefined {
  const deps = new Map(nodes.map((n) => [n.id, n.dependsOn]));
  const state = new Map<string, 1 | 2>();
  for (const start of deps.keys()) {
    if (state.has(start)) continue;
    const stack: Array<{ id: string; next: number }> = [{ id: start, next: 0 }];
    const onPath: string[] = [start];
    state.set(start, 1);
    while (stack.length > 0) {
      const top = stack[stack.length - 1] as { id: string; next: number };
      const list = deps.get(top.id) ?? [];
      if (top.next >= list.length) {
        state.set(top.id, 2);
        stack.pop();
        onPath.pop();
        continue;
      }
      const dep = list[top.next++] as string;
      const s = state.get(dep);
      if (s === 1) return [...onPath.slice(onPath.indexOf(dep)), dep];
      if (s === undefined && deps.has(dep)) {
        state.set(dep, 1);
        stack.push({ id: dep, next: 0 });
        onPath.push(dep);
      }
    }
  }
  return undefined;
}
