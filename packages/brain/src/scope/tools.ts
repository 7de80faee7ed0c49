/**
 * Tool allow/deny patterns. An entry is `NameGlob` or `NameGlob(ArgGlob)`; `*` in either part matches any
 * run of characters. `Bash` is every Bash call, `Bash(git *)` only those whose subject (the command line,
 * or a path for file tools) matches `git *`. An allow-list of `undefined` means "no restriction"; an empty
 * allow-list grants no tool at all.
 */

export const TOOL_ENTRY_PATTERN = /^([A-Za-z0-9_.:*-]{1,128})(?:\(([^\n\r\0]{0,512})\))?$/;

export interface ToolEntry {
  readonly name: string;
  readonly arg: string | undefined;
}

export function parseToolEntry(entry: string): ToolEntry | undefined {
  const match = TOOL_ENTRY_PATTERN.exec(entry);
  if (!match?.[1]) return undefined;
  return { name: match[1], arg: match[2] };
}

function entryOf(entry: string): ToolEntry {
  const parsed = parseToolEntry(entry);
  // Entries reach these helpers only after schema validation; an unparsable one matches nothing.
  return parsed ?? { name: "\0", arg: "\0" };
}

/** Wildcard match where `*` in `pattern` consumes any run of `text`. */
export function globMatches(pattern: string, text: string): boolean {
  return wildcard(pattern, text, false);
}

/**
 * Language inclusion for `*`-only globs: every string `inner` matches is matched by `outer`. Treating the
 * stars of `inner` as a symbol only a star of `outer` can consume decides it exactly (instantiate each star
 * of `inner` with a character `outer` never names: `outer` must swallow it with a star).
 */
export function globCovers(outer: string, inner: string): boolean {
  return wildcard(outer, inner, true);
}

function wildcard(pattern: string, text: string, textStarsAreSymbols: boolean): boolean {
  let p = 0;
  let t = 0;
  let starP = -1;
  let starT = -1;
  while (t < text.length) {
    const pc = pattern[p];
    const tc = text[t];
    if (pc === "*") {
      starP = p++;
      starT = t;
    } else if (pc !== undefined && pc === tc && !(textStarsAreSymbols && tc === "*")) {
      p++;
      t++;
    } else if (starP >= 0) {
      p = starP + 1;
      t = ++starT;
    } else {
      return false;
    }
  }
  while (pattern[p] === "*") p++;
  return p === pattern.length;
}

/** Whether entry `outer` allows every call entry `inner` allows. */
export function entryCovers(outer: string, inner: string): boolean {
  const a = entryOf(outer);
  const b = entryOf(inner);
  if (!globCovers(a.name, b.name)) return false;
  if (a.arg === undefined) return true;
  return b.arg !== undefined && globCovers(a.arg, b.arg);
}

/**
 * Whether the `held` allow-list covers every entry of `requested`, each one entirely by a single held
 * entry. Overlap is not enough: `Bash(git *)` held does not cover `Bash` requested. `undefined` held is
 * unrestricted and covers anything; `undefined` requested (unrestricted) is covered only by that.
 */
export function listCovers(
  held: readonly string[] | undefined,
  requested: readonly string[] | undefined,
): boolean {
  if (held === undefined) return true;
  if (requested === undefined) return false;
  return requested.every((entry) => held.some((h) => entryCovers(h, entry)));
}

function sortedUnique(entries: Iterable<string>): string[] {
  return [...new Set(entries)].sort();
}

/**
 * The allow-list both sides grant. Each kept entry is covered by an entry of each side; an entry that only
 * partly overlaps the other side (neither covers the other) is dropped, which narrows and never widens.
 */
export function intersectAllow(
  requested: readonly string[] | undefined,
  grant: readonly string[] | undefined,
): string[] | undefined {
  if (requested === undefined) return grant === undefined ? undefined : sortedUnique(grant);
  if (grant === undefined) return sortedUnique(requested);
  const out: string[] = [];
  for (const r of requested) {
    if (grant.some((g) => entryCovers(g, r))) out.push(r);
    else for (const g of grant) if (entryCovers(r, g)) out.push(g);
  }
  return sortedUnique(out);
}

export function unionDeny(...lists: readonly (readonly string[] | undefined)[]): string[] {
  return sortedUnique(lists.flatMap((list) => list ?? []));
}

export interface ToolLists {
  readonly allow?: readonly string[] | undefined;
  readonly deny: readonly string[];
}

export type ToolCallVerdict =
  | { readonly ok: true }
  | { readonly ok: false; readonly reason: "not_allowed" }
  | { readonly ok: false; readonly reason: "denied"; readonly entry: string };

function entryMatchesCall(
  entry: string,
  name: string,
  subject: string | undefined,
  forDeny: boolean,
): boolean {
  const e = entryOf(entry);
  if (!globMatches(e.name, name)) return false;
  if (e.arg === undefined) return true;
  // A call without a subject cannot prove it stays inside an argument pattern: allow fails closed, and so
  // does deny (the denial applies).
  if (subject === undefined) return forDeny;
  return globMatches(e.arg, subject);
}

/** Decides one call of tool `name` whose subject is `subject` (command line, or path). Denial wins. */
export function toolCallVerdict(lists: ToolLists, name: string, subject?: string): ToolCallVerdict {
  const denied = lists.deny.find((entry) => entryMatchesCall(entry, name, subject, true));
  if (denied !== undefined) return { ok: false, reason: "denied", entry: denied };
  if (lists.allow === undefined) return { ok: true };
  return lists.allow.some((entry) => entryMatchesCall(entry, name, subject, false))
    ? { ok: true }
    : { ok: false, reason: "not_allowed" };
}
