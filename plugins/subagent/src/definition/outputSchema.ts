import { RE2JS } from "re2js";
import { z } from "zod";

/**
 * Bounds of a node's `outputSchema`. The schema is walked without recursion and refused beyond them, so a
 * deeply nested or huge schema is a typed definition error, never a RangeError in a converter or validator.
 */
export const OUTPUT_SCHEMA_LIMITS = { depth: 32, values: 4096 } as const;

/**
 * A JSON Schema `pattern` compiled for RE2 (linear-time matching, no catastrophic backtracking). A pattern
 * RE2 cannot run (backreferences, lookaround) throws: it is refused when the definition is read.
 */
export function compileOutputPattern(source: string): RE2JS {
  return RE2JS.compile(RE2JS.translateRegExp(source));
}

/** What is wrong with an output schema's shape (depth, size, patterns), or undefined. Names no key or value. */
export function outputSchemaShapeProblem(schema: unknown): string | undefined {
  const stack: Array<{ value: unknown; depth: number }> = [{ value: schema, depth: 1 }];
  let values = 0;
  while (stack.length > 0) {
    const { value, depth } = stack.pop() as { value: unknown; depth: number };
    if (++values > OUTPUT_SCHEMA_LIMITS.values) {
      return `is too large: more than ${OUTPUT_SCHEMA_LIMITS.values} values`;
    }
    if (typeof value !== "object" || value === null) continue;
    if (depth > OUTPUT_SCHEMA_LIMITS.depth) {
      return `is too deep: more than ${OUTPUT_SCHEMA_LIMITS.depth} levels`;
    }
    const record = value as Record<string, unknown>;
    if (!Array.isArray(value)) {
      const bad = unsupportedPattern(record);
      if (bad) return bad;
    }
    for (const child of Object.values(record)) stack.push({ value: child, depth: depth + 1 });
  }
  return undefined;
}

function unsupportedPattern(schema: Record<string, unknown>): string | undefined {
  const sources: string[] = [];
  if (typeof schema.pattern === "string") sources.push(schema.pattern);
  const props = schema.patternProperties;
  if (typeof props === "object" && props !== null && !Array.isArray(props))
    sources.push(...Object.keys(props));
  for (const source of sources) {
    try {
      compileOutputPattern(source);
    } catch {
      return "has a pattern the linear-time regular expression engine cannot run (backreference or lookaround)";
    }
  }
  return undefined;
}

/**
 * A RegExp whose `test` (all zod's JSON Schema validators call) runs on RE2. It extends RegExp so code that
 * checks `instanceof RegExp` or reads `source` keeps working.
 */
class Re2RegExp extends RegExp {
  readonly #re2: RE2JS | null;
  constructor(source: string | RegExp, flags?: string) {
    super(source, flags);
    // zod's own expressions (formats) may use lookaround RE2 lacks: they are zod's, not a definition's,
    // and keep the native engine; every definition pattern was compiled for RE2 when it was read
    let re2: RE2JS | null = null;
    try {
      re2 = compileOutputPattern(typeof source === "string" ? source : source.source);
    } catch {
      re2 = null;
    }
    this.#re2 = re2;
  }
  override test(input: string): boolean {
    return this.#re2 ? this.#re2.matcher(String(input)).find() : super.test(input);
  }
}

/**
 * zod's `fromJSONSchema` compiles `pattern` and `patternProperties` with the global `RegExp` and offers no
 * hook, so for the one synchronous conversion the global is RE2-backed: the compiled validators keep the
 * RE2 instances, and no other code can run in between. Restored in `finally`, even when conversion throws.
 */
function fromJSONSchemaOnRe2(schema: Record<string, unknown>): z.ZodType {
  const native = globalThis.RegExp;
  globalThis.RegExp = Re2RegExp as unknown as RegExpConstructor;
  try {
    return z.fromJSONSchema(schema as never);
  } finally {
    globalThis.RegExp = native;
  }
}

/**
 * Checks a node's answer (JSON text) against its output schema: undefined when it matches, else why not.
 * Linear in the answer: patterns run on RE2; the schema's own bounds were checked at definition time.
 */
export function outputSchemaProblem(schema: Record<string, unknown>, reply: string): string | undefined {
  let value: unknown;
  try {
    value = JSON.parse(reply);
  } catch {
    return "the answer is not JSON, but the node declares an output schema";
  }
  try {
    const shape = outputSchemaShapeProblem(schema);
    if (shape) return `the output schema cannot be used: it ${shape}`;
    const parsed = fromJSONSchemaOnRe2(schema).safeParse(value);
    if (parsed.success) return undefined;
    const first = parsed.error.issues[0];
    return `the answer does not match the output schema at ${first?.path.join(".") || "(root)"}: ${first?.message}`;
  } catch (e) {
    return `the output schema cannot be used: ${e instanceof Error ? e.message : String(e)}`;
  }
}
