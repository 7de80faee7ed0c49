/**
 * Canonical JSON: object keys sorted by code unit, `undefined` members dropped, no whitespace. Two equal
 * scopes always serialize to the same bytes, so stored scopes compare by text and hash stably.
 */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(canonicalize(value));
}

function canonicalize(value: unknown): unknown {
  if (value === null || typeof value === "string" || typeof value === "boolean") return value;
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new TypeError("canonical JSON has no non-finite numbers");
    return value;
  }
  if (Array.isArray(value)) return value.map((item) => (item === undefined ? null : canonicalize(item)));
  if (typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) {
      const member = (value as Record<string, unknown>)[key];
      if (member !== undefined) out[key] = canonicalize(member);
    }
    return out;
  }
  throw new TypeError(`canonical JSON cannot hold a ${typeof value}`);
}
