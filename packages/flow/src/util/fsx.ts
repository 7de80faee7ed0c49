import { randomBytes } from "node:crypto";
import {
  chmodSync,
  closeSync,
  fsyncSync,
  lstatSync,
  mkdirSync,
  openSync,
  renameSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { dirname, join } from "node:path";

/** Temporary names: this process's pid, a random tag drawn once, and a counter. */
const tmpTag = `${process.pid}-${randomBytes(4).toString("hex")}`;
let tmpCount = 0;
const tmpName = (path: string) => join(dirname(path), `.tmp-${tmpTag}-${(tmpCount++).toString(36)}`);

/**
 * Writes a whole file under a temporary name in the same directory and renames it into place, so a reader
 * sees the old file, no file, or the new one whole. With `durable` the data and the directory are fsync'd.
 */
export function writeFileAtomic(path: string, data: string, durable = false): void {
  const tmp = tmpName(path);
  try {
    if (durable) {
      const fd = openSync(tmp, "w");
      try {
        writeFileSync(fd, data);
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
    } else {
      writeFileSync(tmp, data);
    }
    renameSync(tmp, path);
  } catch (e) {
    try {
      unlinkSync(tmp);
    } catch {
      // the temporary file may never have been made
    }
    throw e;
  }
  if (durable) fsyncDir(dirname(path));
}

export function fsyncDir(dir: string): void {
  const fd = openSync(dir, "r");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

export function removeIfExists(path: string): boolean {
  try {
    unlinkSync(path);
    return true;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return false;
    throw e;
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * A directory of crw's own that holds work (journals, packets, workspaces, logs with model output): made
 * 0700 and, when it exists wider (made by an older crw, or by hand), narrowed to 0700 — an explicit
 * chmod, as mkdir's mode is masked by the umask and applies only to a directory it makes. Answers the
 * mode it had when it was narrowed, else null. A symbolic link is left alone.
 */
export function privateDir(path: string): string | null {
  mkdirSync(path, { recursive: true, mode: 0o700 });
  const st = lstatSync(path);
  if (st.isSymbolicLink() || (st.mode & 0o077) === 0) return null;
  chmodSync(path, 0o700);
  return (st.mode & 0o777).toString(8);
}
