import { type Document, isMap, isScalar, LineCounter, parseDocument } from "yaml";
import type { z } from "zod";
import { WorkflowDefinitionSchema, WorkflowNodeSchema } from "./schema.js";

/**
 * Definition errors reach any account that may start a workflow, so they never quote the file: no line
 * text, no value, no key the schema does not know. They name the file as the caller gave it, the line and
 * column, and the kind of error.
 */
const KNOWN_KEYS = new Set<string>([
  ...Object.keys(WorkflowDefinitionSchema.shape),
  ...Object.keys(WorkflowNodeSchema.shape),
  "allow",
  "deny",
]);

/** An issue path with every key the schema does not define replaced by `*`. */
export function safePath(path: readonly PropertyKey[]): string {
  return (
    path.map((p) => (typeof p === "number" || KNOWN_KEYS.has(String(p)) ? String(p) : "*")).join(".") ||
    "(root)"
  );
}

export function inFile(source: string | undefined): string {
  return source === undefined ? "" : ` ${source}`;
}

export function at(pos: { line: number; col: number } | undefined): string {
  return pos ? ` at line ${pos.line}, column ${pos.col}` : "";
}

/**
 * Where an issue sits in `text`, from one parse of the text made on first use and shared by every issue:
 * `issueText` locates up to eight issues, and parsing a 256 KiB text once per issue was eight times the
 * work of the definition's own parse. Each answer is best effort: undefined if unknown.
 */
export function locator(
  text: string,
): (path: readonly PropertyKey[], key?: string) => { line: number; col: number } | undefined {
  let parsed: { doc: Document.Parsed; lineCounter: LineCounter } | null | undefined;
  return (path, key) => {
    try {
      if (parsed === undefined) {
        const lineCounter = new LineCounter();
        parsed = { doc: parseDocument(text, { lineCounter, uniqueKeys: false }), lineCounter };
      }
      if (parsed === null) return undefined;
      const { doc, lineCounter } = parsed;
      const node = path.length === 0 ? doc.contents : doc.getIn(path as unknown[], true);
      let range = (node as { range?: [number, number, number] } | undefined)?.range;
      if (key !== undefined && isMap(node)) {
        const pair = node.items.find((p) => isScalar(p.key) && String(p.key.value) === key);
        range = (pair?.key as { range?: [number, number, number] } | undefined)?.range ?? range;
      }
      return range ? lineCounter.linePos(range[0]) : undefined;
    } catch {
      parsed ??= null;
      return undefined;
    }
  };
}

/** The first issues, each as its safe path, its location and its kind (an unknown field is named as such). */
export function issueText(error: z.ZodError, text: string | undefined): string {
  const where = text === undefined ? undefined : locator(text);
  return error.issues
    .slice(0, 8)
    .map((i) => {
      const key = i.code === "unrecognized_keys" ? i.keys[0] : undefined;
      const place = where ? at(where(i.path, key)) : "";
      const kind = i.code === "unrecognized_keys" ? `unknown field (${i.keys.length})` : i.message;
      return `${safePath(i.path)}${place}: ${kind}`;
    })
    .join("; ");
}

interface Visit {
  readonly value: unknown;
  readonly key: PropertyKey | undefined;
  readonly parent: Visit | undefined;
}

function pathOf(visit: Visit, last?: PropertyKey): PropertyKey[] {
  const path: PropertyKey[] = last === undefined ? [] : [last];
  for (let v: Visit | undefined = visit; v?.key !== undefined; v = v.parent) path.unshift(v.key);
  return path;
}

/**
 * The path of the first string (or key) holding U+0000, which PostgreSQL cannot store; undefined if none.
 * Iterative with parent links, so a deeply nested document costs neither stack nor copied paths.
 */
export function nulField(raw: unknown): PropertyKey[] | undefined {
  const stack: Visit[] = [{ value: raw, key: undefined, parent: undefined }];
  while (stack.length > 0) {
    const visit = stack.pop() as Visit;
    const { value } = visit;
    if (typeof value === "string") {
      if (value.includes("\0")) return pathOf(visit);
      continue;
    }
    if (typeof value !== "object" || value === null) continue;
    const entries: Array<[PropertyKey, unknown]> = Array.isArray(value)
      ? value.map((v, i) => [i, v])
      : Object.entries(value);
    for (const [key, child] of entries) {
      if (typeof key === "string" && key.includes("\0")) return pathOf(visit, key);
      stack.push({ value: child, key, parent: visit });
    }
  }
  return undefined;
}
