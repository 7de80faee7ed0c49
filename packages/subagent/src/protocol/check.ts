/**
 * Small strict validators for the frames a runner must read before it is ready (see bootFrame.ts). The
 * runner's boot path does not load the schema library; each check here decides exactly what the matching
 * schema in input.ts/policy.ts/sessionTurn.ts decides, and builds the same parsed value
 * (test/bootFrame.test.ts holds the two side by side). Strings are measured in code points, as the schemas
 * measure them.
 */

export type IssuePath = readonly (string | number)[];
export interface Issue {
  readonly path: IssuePath;
  readonly message: string;
}

/** Checks `value` at `path`: the parsed value, or (return unused) why not, recorded in `issues`. */
export type Check<T> = (value: unknown, path: IssuePath, issues: Issue[]) => T;

/** A shape entry that may be absent or undefined. */
export type OptionalCheck<T> = Check<T | undefined> & { readonly optional: true };

type Shape = Record<string, Check<unknown>>;
type Parsed<S extends Shape> = { [K in keyof S]: S[K] extends Check<infer T> ? T : never };

function refuse<T>(issues: Issue[], path: IssuePath, message: string): T {
  issues.push({ path, message });
  return undefined as T;
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A record must be a plain object: no class instance with its own prototype chain passes. */
function isPlainObject(value: unknown): value is Record<PropertyKey, unknown> {
  if (!isObject(value)) return false;
  const ctor = value.constructor;
  if (typeof ctor !== "function") return true;
  const proto: unknown = ctor.prototype;
  return isObject(proto) && Object.hasOwn(proto, "isPrototypeOf");
}

/** Unicode code points; a lone surrogate counts as one. */
function codePoints(s: string): number {
  let n = s.length;
  for (let i = 0; i < s.length - 1; i++) {
    if ((s.charCodeAt(i) & 0xfc00) === 0xd800 && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n--;
      i++;
    }
  }
  return n;
}

function lengthIssue(s: string, min: number, max: number): string | undefined {
  // A code point is one or two UTF-16 units: within these bounds the count cannot miss, so it is skipped.
  if (s.length <= max && s.length >= 2 * min) return undefined;
  const n = codePoints(s);
  return n < min || n > max ? `expected ${min} to ${max} characters, got ${n}` : undefined;
}

export function text(min: number, max: number): Check<string> {
  return (value, path, issues) => {
    if (typeof value !== "string") return refuse(issues, path, `expected a string, got ${kindOf(value)}`);
    const wrong = lengthIssue(value, min, max);
    return wrong ? refuse(issues, path, wrong) : value;
  };
}

/** An absolute URL. Like the schema, it keeps the trimmed text less tabs and line breaks, and bounds that. */
export function url(max: number): Check<string> {
  return (value, path, issues) => {
    if (typeof value !== "string") return refuse(issues, path, `expected a string, got ${kindOf(value)}`);
    const trimmed = value.trim();
    if (!URL.canParse(trimmed)) return refuse(issues, path, "expected an absolute URL");
    const kept = trimmed.replace(/[\t\n\r]/g, "");
    const wrong = lengthIssue(kept, 0, max);
    return wrong ? refuse(issues, path, wrong) : kept;
  };
}

/** A finite number in [min, max]; with `integer`, a safe integer. */
export function number(min: number, max: number, integer: boolean): Check<number> {
  return (value, path, issues) => {
    if (typeof value !== "number" || !Number.isFinite(value))
      return refuse(issues, path, `expected a finite number, got ${kindOf(value)}`);
    if (integer && !Number.isSafeInteger(value))
      return refuse(issues, path, `expected a safe integer, got ${value}`);
    if (value < min || value > max) return refuse(issues, path, `expected ${min} to ${max}, got ${value}`);
    return value;
  };
}

export const integer = (min: number, max = Number.MAX_SAFE_INTEGER) => number(min, max, true);

/** Any string, unbounded. */
export const anyText: Check<string> = (value, path, issues) =>
  typeof value === "string" ? value : refuse(issues, path, `expected a string, got ${kindOf(value)}`);

export const boolean: Check<boolean> = (value, path, issues) =>
  typeof value === "boolean" ? value : refuse(issues, path, `expected a boolean, got ${kindOf(value)}`);

/** One of a fixed set of strings (the schema's enum). */
export function oneOf<const T extends string>(values: readonly T[]): Check<T> {
  const known = new Set<unknown>(values);
  return (value, path, issues) =>
    known.has(value) ? (value as T) : refuse(issues, path, `expected one of ${values.join(" | ")}`);
}

/** A string the pattern matches whole; `describe` names it in the refusal. */
export function matching(pattern: RegExp, describe: string): Check<string> {
  return (value, path, issues) => {
    if (typeof value !== "string") return refuse(issues, path, `expected a string, got ${kindOf(value)}`);
    return pattern.test(value) ? value : refuse(issues, path, `expected ${describe}`);
  };
}

export function nullable<T>(check: Check<T>): Check<T | null> {
  return (value, path, issues) => (value === null ? null : check(value, path, issues));
}

export function literal<const T extends string>(expected: T): Check<T> {
  return (value, path, issues) =>
    value === expected ? expected : refuse(issues, path, `expected "${expected}", got ${kindOf(value)}`);
}

export function optional<T>(check: Check<T>): OptionalCheck<T> {
  const run: Check<T | undefined> = (value, path, issues) =>
    value === undefined ? undefined : check(value, path, issues);
  return Object.assign(run, { optional: true as const });
}

const isOptional = (check: Check<unknown>): boolean =>
  (check as Partial<OptionalCheck<unknown>>).optional === true;

/** Exactly the shape's keys: a required key must be present, any other one (inherited too) is refused. */
export function strictObject<S extends Shape>(shape: S): Check<Parsed<S>> {
  const keys = Object.keys(shape);
  const known = new Set(keys);
  return (value, path, issues) => {
    if (!isObject(value)) return refuse(issues, path, `expected an object, got ${kindOf(value)}`);
    const out: Record<string, unknown> = {};
    for (const key of keys) {
      const check = shape[key] as Check<unknown>;
      const field = value[key];
      if (field === undefined && isOptional(check)) {
        if (key in value) out[key] = undefined;
        continue;
      }
      out[key] = check(field, [...path, key], issues);
    }
    for (const key in value) if (!known.has(key)) refuse(issues, path, `unrecognized key "${key}"`);
    return out as Parsed<S>;
  };
}

/** Every index is checked, holes of a sparse array too (read as undefined, as the schema reads them). */
export function array<T>(item: Check<T>, max = Number.POSITIVE_INFINITY): Check<T[]> {
  return (value, path, issues) => {
    if (!Array.isArray(value)) return refuse(issues, path, `expected an array, got ${kindOf(value)}`);
    if (value.length > max) refuse(issues, path, `expected at most ${max} entries, got ${value.length}`);
    const out: T[] = new Array(value.length);
    for (let i = 0; i < value.length; i++) out[i] = item(value[i], [...path, i], issues);
    return out;
  };
}

/**
 * A plain object's own enumerable entries, each key checked by `key`. A `__proto__` entry is skipped, never
 * copied: written into the parsed record it would replace the record's prototype.
 */
export function record<T>(
  key: (k: string) => boolean,
  describe: string,
  entry: Check<T>,
): Check<Record<string, T>> {
  return (value, path, issues) => {
    if (!isPlainObject(value)) return refuse(issues, path, `expected a record, got ${kindOf(value)}`);
    const out: Record<string, T> = {};
    for (const k of Reflect.ownKeys(value)) {
      if (k === "__proto__" || !Object.prototype.propertyIsEnumerable.call(value, k)) continue;
      if (typeof k !== "string" || !key(k)) {
        refuse(issues, path, `invalid key ${String(k)}: expected ${describe}`);
        continue;
      }
      out[k] = entry(value[k], [...path, k], issues);
    }
    return out;
  };
}

/** A string key of min to max code points. */
export const textKey = (min: number, max: number) => (k: string) => lengthIssue(k, min, max) === undefined;

/** A key from a fixed set, each optional. */
export const oneOfKey =
  (keys: readonly string[]) =>
  (k: string): boolean =>
    keys.includes(k);

/**
 * An object whose `key` names which check applies (the schema's discriminated union): the value is read as
 * the schema reads it, inherited too, and only the listed values select a check.
 */
export function byKey<O extends Record<string, Check<unknown>>>(
  key: string,
  options: O,
): Check<O[keyof O] extends Check<infer T> ? T : never> {
  type T = O[keyof O] extends Check<infer U> ? U : never;
  const checks = new Map<unknown, Check<T>>(Object.entries(options) as [string, Check<T>][]);
  return (value, path, issues) => {
    if (!isObject(value)) return refuse(issues, path, `expected an object, got ${kindOf(value)}`);
    const check = checks.get(value[key]);
    if (!check) return refuse(issues, [...path, key], `expected one of ${[...checks.keys()].join(" | ")}`);
    return check(value, path, issues);
  };
}

/** The first of the checks that passes, as the schema's union takes its first option that parses. */
export function firstOf<A, B>(first: Check<A>, second: Check<B>): Check<A | B> {
  return (value, path, issues) => {
    const ofFirst: Issue[] = [];
    const a = first(value, path, ofFirst);
    if (ofFirst.length === 0) return a;
    const ofSecond: Issue[] = [];
    const b = second(value, path, ofSecond);
    if (ofSecond.length === 0) return b;
    return refuse(issues, path, `no option matched (${summarizeIssues([...ofFirst, ...ofSecond])})`);
  };
}

/** A further rule on a value the check accepted; it runs only when nothing else was wrong, as a refinement does. */
export function refined<T>(check: Check<T>, holds: (value: T) => boolean, message: string): Check<T> {
  return (value, path, issues) => {
    const before = issues.length;
    const out = check(value, path, issues);
    if (issues.length === before && !holds(out)) refuse(issues, path, message);
    return out;
  };
}

/** Any value, undefined included. */
export const unknownValue: Check<unknown> = (value) => value;

/** The parsed value frozen, as the schema's readonly() freezes it. */
export function frozen<T>(check: Check<T>): Check<Readonly<T>> {
  return (value, path, issues) => {
    const out = check(value, path, issues);
    return isObject(out) ? Object.freeze(out) : out;
  };
}

function kindOf(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number" && !Number.isFinite(value)) return String(value);
  return typeof value;
}

/** The issues as one line, the way refused frames are logged: at most five, each with its path. */
export function summarizeIssues(issues: readonly Issue[]): string {
  return issues
    .slice(0, 5)
    .map((i) => `${i.path.join(".") || "<frame>"}: ${i.message}`)
    .join("; ");
}
