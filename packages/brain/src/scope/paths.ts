import { posix, win32 } from "node:path";

/**
 * How a placement path is spelled. Host and managed scopes take only POSIX absolute paths; a local target
 * (a paired computer) may also be placed on a Windows drive or UNC share. `C:foo` (relative to the current
 * directory of drive C) and `\foo` (rooted on whatever drive is current) are ambiguous and always refused.
 */
export type PathSpelling =
  | "posix"
  | "windows-drive"
  | "unc"
  | "drive-relative"
  | "current-drive"
  | "relative";

export function pathSpelling(path: string): PathSpelling {
  if (path.startsWith("\\\\") || path.startsWith("//")) {
    // A UNC share names a server and a share; `.`/`..`/`?` there are device or dot segments, not names.
    const unc = /^[\\/]{2}([^\\/]+)[\\/]([^\\/]+)/.exec(path);
    const dots = (name: string | undefined) => name === "." || name === ".." || name === "?";
    return unc && !dots(unc[1]) && !dots(unc[2]) ? "unc" : "relative";
  }
  if (/^[A-Za-z]:[\\/]/.test(path)) return "windows-drive";
  if (/^[A-Za-z]:/.test(path)) return "drive-relative";
  if (path.startsWith("/")) return "posix";
  if (path.startsWith("\\")) return "current-drive";
  return "relative";
}

// biome-ignore lint/suspicious/noControlCharactersInRegex: refusing control characters is the point
const CONTROL = /[\0-\x1f]/;

/** Normalizes an absolute placement for `target`, or returns why it is refused. */
export function normalizePlacement(
  path: string,
  targetKind: "host" | "managed" | "local",
): { ok: true; path: string } | { ok: false; reason: string } {
  if (CONTROL.test(path)) return { ok: false, reason: "path contains control characters" };
  const spelling = pathSpelling(path);
  if (spelling === "drive-relative") return { ok: false, reason: "drive-relative paths are ambiguous" };
  if (spelling === "current-drive") return { ok: false, reason: "current-drive paths are ambiguous" };
  if (spelling === "relative") return { ok: false, reason: "path must be absolute" };
  if (spelling === "posix") {
    let normal = posix.normalize(path);
    if (normal.length > 1 && normal.endsWith("/")) normal = normal.slice(0, -1);
    return { ok: true, path: normal };
  }
  if (targetKind !== "local") return { ok: false, reason: `${targetKind} scopes take POSIX paths only` };
  let normal = win32.normalize(path);
  if (normal.length > 3 && normal.endsWith("\\") && spelling === "windows-drive")
    normal = normal.slice(0, -1);
  // A stored placement must read back as itself: a spelling that normalizes into another kind is refused.
  if (pathSpelling(normal) !== spelling)
    return { ok: false, reason: "path does not normalize to an absolute path" };
  return { ok: true, path: normal };
}

/**
 * The artifact resolver's canonical spelling: forward slashes, no `.`/`..` segments, no doubled or trailing
 * slash; `C:/dir/file` for a drive, `//server/share/file` for UNC, `/dir/file` for POSIX.
 */
export function isCanonicalArtifactPath(path: string): boolean {
  if (CONTROL.test(path) || path.includes("\\")) return false;
  let rest: string;
  if (/^[A-Za-z]:\//.test(path)) rest = path.slice(2);
  else if (path.startsWith("//")) rest = path.slice(1);
  else if (path.startsWith("/")) rest = path;
  else return false;
  const segments = rest.slice(1).split("/");
  return segments.every((s) => s !== "" && s !== "." && s !== "..");
}

/** Whether `child` is `root` or inside it (both canonical POSIX). */
export function posixInside(root: string, child: string): boolean {
  if (root === "/") return child.startsWith("/");
  return child === root || child.startsWith(`${root}/`);
}
