import { accessSync, constants, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { isAbsolute } from "node:path";

/**
 * The one temp-location function (the seed's tmploc.DirFrom): the TMPDIR a run records and runs below.
 * It answers the environment's TMPDIR as written, else the platform default, and says why a directory
 * cannot be used: not absolute, missing, not a directory, or not writable.
 */
export type TmpDirAnswer =
  | { ok: true; dir: string; defaulted: boolean }
  | { ok: false; dir: string; reason: string };

export function dirFrom(env: NodeJS.ProcessEnv = process.env): TmpDirAnswer {
  const raw = env.TMPDIR;
  const defaulted = raw === undefined || raw === "";
  const dir = defaulted ? defaultTmp() : raw;
  const reason = unusable(dir);
  return reason ? { ok: false, dir, reason } : { ok: true, dir, defaulted };
}

function defaultTmp(): string {
  const saved = process.env.TMPDIR;
  delete process.env.TMPDIR;
  try {
    return tmpdir();
  } finally {
    if (saved !== undefined) process.env.TMPDIR = saved;
  }
}

/**
 * Why `dir` cannot be a run's TMPDIR (or, named by `what`, another directory the run writes in), or null
 * when it can.
 */
export function unusable(dir: string, what = "TMPDIR"): string | null {
  if (!isAbsolute(dir)) return `${what} '${dir}' is not an absolute path`;
  let st: ReturnType<typeof statSync>;
  try {
    st = statSync(dir);
  } catch {
    return `${what} '${dir}' does not exist`;
  }
  if (!st.isDirectory()) return `${what} '${dir}' is not a directory`;
  try {
    accessSync(dir, constants.W_OK | constants.X_OK);
  } catch {
    return `${what} '${dir}' is not writable`;
  }
  return null;
}
