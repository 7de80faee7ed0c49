import type { DelegatedExecutionScope } from "./schema.js";

/**
 * Parsed stored scopes, by their exact text. A turn reads its child's stored scope several times (the call's
 * continuation clamp, the identity, the system prompt, the addressability checks), always the same canonical
 * text, and the schema's parse was a measurable share of the daemon's CPU per turn. The key is the whole text,
 * which cannot change under the entry, so a parse is only ever handed out for the text it was made from. Only
 * successes are kept (a malformed text throws every time). Entries are deeply frozen copies: every reader
 * gets the same object, and none can change what the next one sees.
 */
const MAX_ENTRIES = 256;
/** Longer texts are parsed every time: the memo stays within MAX_ENTRIES × this many UTF-16 units. */
const MAX_TEXT_LENGTH = 65_536;

const byText = new Map<string, DelegatedExecutionScope>();
/** Every scope handed out by this module: already parsed and frozen, so reading it again needs no parse. */
const handedOut = new WeakSet<object>();

/**
 * A deeply frozen copy: the parse's own objects are not frozen in place, because the schema's defaults hand
 * out shared members (every scope without a `deny` list gets the same empty array).
 */
function frozenCopy<T>(value: T): T {
  if (typeof value !== "object" || value === null) return value;
  if (Array.isArray(value)) return Object.freeze(value.map(frozenCopy)) as T;
  const out: Record<string, unknown> = {};
  for (const [key, member] of Object.entries(value)) out[key] = frozenCopy(member);
  return Object.freeze(out) as T;
}

/** The scope parsed from `text`, from the memo or by `parse` (whose throw passes through, and is not kept). */
export function storedScopeOf(
  text: string,
  parse: (text: string) => DelegatedExecutionScope,
): DelegatedExecutionScope {
  const known = byText.get(text);
  if (known) {
    // Most recently used last: the oldest entry is the one evicted.
    byText.delete(text);
    byText.set(text, known);
    return known;
  }
  const scope = frozenScope(parse(text));
  if (text.length <= MAX_TEXT_LENGTH) {
    byText.set(text, scope);
    if (byText.size > MAX_ENTRIES) byText.delete(byText.keys().next().value as string);
  }
  return scope;
}

/** A parsed scope as a deeply frozen copy, known as one this module handed out. */
export function frozenScope(parsed: DelegatedExecutionScope): DelegatedExecutionScope {
  const scope = frozenCopy(parsed);
  handedOut.add(scope);
  return scope;
}

/** Whether `value` is a scope this module handed out (parsed, and frozen since). */
export function isHandedOutScope(value: unknown): value is DelegatedExecutionScope {
  return typeof value === "object" && value !== null && handedOut.has(value);
}

/** How many texts the memo holds (for tests of its bound). */
export function storedScopeMemoSize(): number {
  return byText.size;
}
