import {
  isAlias,
  isMap,
  isPair,
  isScalar,
  isSeq,
  LineCounter,
  parseDocument,
  YAMLError,
  YAMLParseError,
} from "yaml";
import { WorkflowDefinitionError } from "../errors.js";
import { at, inFile, issueText, nulField, safePath } from "./errorText.js";
import {
  AddedNodesSchema,
  DEFINITION_LIMITS,
  type WorkflowDefinition,
  WorkflowDefinitionSchema,
  type WorkflowNode,
} from "./schema.js";

/**
 * Parses definition text (YAML, of which JSON is a subset; `format` only sharpens the error) into a
 * validated definition whose node graph is a DAG. Every refusal is a `WorkflowDefinitionError`; `source`
 * is the file as the caller named it, for the message.
 */
export function parseWorkflowDefinition(
  text: string,
  format: "yaml" | "json" = "yaml",
  source?: string,
): WorkflowDefinition {
  const bytes = Buffer.byteLength(text);
  if (bytes > DEFINITION_LIMITS.bytes) {
    throw new WorkflowDefinitionError(
      "definition_too_large",
      `workflow definition${inFile(source)} is ${bytes} bytes; the limit is ${DEFINITION_LIMITS.bytes}`,
      { bytes, limit: DEFINITION_LIMITS.bytes },
    );
  }
  const depth = flowDepth(text);
  if (depth > DEFINITION_LIMITS.nesting) {
    throw new WorkflowDefinitionError(
      "definition_invalid",
      `workflow definition${inFile(source)} is invalid: outputSchema or another value is too deep: more than ${DEFINITION_LIMITS.nesting} levels`,
      { depth, limit: DEFINITION_LIMITS.nesting },
    );
  }
  let raw: unknown;
  try {
    raw = format === "json" ? JSON.parse(text) : parseYamlUniqueKeys(text);
  } catch (e) {
    // The parsers' messages quote the offending text; only the kind and the place are kept.
    throw new WorkflowDefinitionError(
      "definition_syntax",
      `workflow definition${inFile(source)} is not valid ${format.toUpperCase()}${syntaxPlace(e, text)}`,
      syntaxKind(e),
    );
  }
  return validateWorkflowDefinition(raw, { text, source });
}

/**
 * YAML text to a value, refusing a duplicate key as yaml's `uniqueKeys: true` does (DUPLICATE_KEY at the
 * repeated key) but in linear time. yaml compares each key with every earlier key of its map: 20,000 keys
 * in a 190 KB definition held the daemon's event loop for seconds inside `workflow.start`. Here each map's
 * scalar keys go through a Set, in one pass over the document without recursion. Warnings are not printed
 * (yaml's `parse` and `toJS` emit them as process warnings, quoting the text).
 */
function parseYamlUniqueKeys(text: string): unknown {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, {
    uniqueKeys: false,
    prettyErrors: true,
    lineCounter,
    // errors only: a warning (a collection as a key, an unknown tag) would go to the process's stderr
    // quoting the definition's text
    logLevel: "error",
  });
  if (doc.errors.length > 0) throw doc.errors[0];
  const repeated = firstRepeatedKey(doc.contents);
  if (repeated !== undefined) {
    const error = new YAMLParseError([repeated, repeated + 1], "DUPLICATE_KEY", "Map keys must be unique");
    error.linePos = [lineCounter.linePos(repeated), lineCounter.linePos(repeated + 1)];
    throw error;
  }
  return doc.toJS({ maxAliasCount: 100 });
}

const EMPTY_KEY = Symbol("empty key");
const pairStart = (map: { range?: [number, number, number] | null }) => map.range?.[0] ?? 0;

/**
 * The offset of the first key (in the text) that repeats an earlier key of the same map, by yaml's
 * equality. The walk visits every map once, in no particular order, and keeps the smallest offset.
 */
function firstRepeatedKey(root: unknown): number | undefined {
  const stack: unknown[] = [root];
  let first: number | undefined;
  while (stack.length > 0) {
    const node = stack.pop();
    if (isAlias(node)) continue;
    if (isMap(node)) {
      const seen = new Set<unknown>();
      for (const pair of node.items) {
        const key = pair.key;
        // yaml's default equality: the same node (two absent keys are both null), or two scalars whose
        // values are === (so NaN never repeats)
        const identity = key === null ? EMPTY_KEY : isScalar(key) ? key.value : undefined;
        if (identity !== undefined && !Number.isNaN(identity)) {
          if (seen.has(identity)) {
            const offset = (isScalar(key) ? key.range?.[0] : undefined) ?? pairStart(node);
            if (first === undefined || offset < first) first = offset;
          } else seen.add(identity);
        }
        stack.push(pair.value, key);
      }
    } else if (isSeq(node)) for (const item of node.items) stack.push(item);
    else if (isPair(node)) stack.push(node.value, node.key);
  }
  return first;
}

function syntaxKind(e: unknown): Record<string, unknown> {
  return e instanceof YAMLError ? { kind: e.code } : {};
}

function syntaxPlace(e: unknown, text: string): string {
  if (e instanceof YAMLError) return `${at(e.linePos?.[0])} (${e.code})`;
  const position = /position (\d+)/.exec(e instanceof Error ? e.message : "")?.[1];
  if (position === undefined) return "";
  const before = text.slice(0, Number(position)).split("\n");
  return at({ line: before.length, col: (before[before.length - 1]?.length ?? 0) + 1 });
}

function refuseNul(raw: unknown, what: string): void {
  const field = nulField(raw);
  if (field === undefined) return;
  throw new WorkflowDefinitionError(
    "definition_invalid",
    `${what} is invalid: ${safePath(field)}: contains U+0000, which cannot be stored`,
    { field: safePath(field) },
  );
}

export function validateWorkflowDefinition(
  raw: unknown,
  from: { text?: string; source?: string } = {},
): WorkflowDefinition {
  const count = nodeCount(raw);
  if (count > DEFINITION_LIMITS.nodes) {
    throw new WorkflowDefinitionError(
      "too_many_nodes",
      `workflow has ${count} nodes; the limit is ${DEFINITION_LIMITS.nodes}`,
      { nodes: count, limit: DEFINITION_LIMITS.nodes },
    );
  }
  refuseNul(raw, `workflow definition${inFile(from.source)}`);
  const parsed = WorkflowDefinitionSchema.safeParse(raw);
  if (!parsed.success) {
    throw new WorkflowDefinitionError(
      "definition_invalid",
      `workflow definition${inFile(from.source)} is invalid: ${issueText(parsed.error, from.text)}`,
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
  refuseNul(raw, "added nodes");
  const parsed = AddedNodesSchema.safeParse(raw);
  if (!parsed.success) {
    throw new WorkflowDefinitionError(
      "definition_invalid",
      `added nodes are invalid: ${issueText(parsed.error, undefined)}`,
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

/**
 * The deepest `[`/`{` nesting of the text, outside quotes and comments. Checked before parsing: the YAML
 * parser exhausts memory or stack on thousands of nested flow collections (block nesting that deep cannot
 * fit in the byte bound).
 */
function flowDepth(text: string): number {
  let depth = 0;
  let max = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"' || c === "'") {
      for (i++; i < text.length && text[i] !== c; i++) if (c === '"' && text[i] === "\\") i++;
    } else if (c === "#" && (i === 0 || /\s/.test(text[i - 1] as string))) {
      while (i < text.length && text[i] !== "\n") i++;
    } else if (c === "[" || c === "{") {
      max = Math.max(max, ++depth);
    } else if (c === "]" || c === "}") {
      depth--;
    }
  }
  return max;
}
