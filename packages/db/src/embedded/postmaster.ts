import { readFile } from "node:fs/promises";
import { join } from "node:path";

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
};

/**
 * The postmaster that runs on `dataDir`, from its `postmaster.pid` (pid on line 1, port on line 4, the
 * Unix socket's directory on line 5, empty when it listens on TCP alone): a cluster whose owner died
 * without stopping it (SIGKILL runs no cleanup).
 */
export async function runningPostmaster(
  dataDir: string,
): Promise<{ pid: number; port: number; socketDir: string | null } | undefined> {
  let text: string;
  try {
    text = await readFile(join(dataDir, "postmaster.pid"), "utf8");
  } catch {
    return undefined;
  }
  const lines = text.split("\n");
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  if (!Number.isInteger(pid) || pid <= 0 || !Number.isInteger(port) || port <= 0) return undefined;
  const socketDir = lines[4]?.trim() || null;
  return alive(pid) ? { pid, port, socketDir } : undefined;
}

/** Fast shutdown of a postmaster by pid (sessions aborted, checkpoint, exit), waiting up to `ms` for it. */
export async function stopPostmaster(pid: number, ms = 30_000): Promise<void> {
  if (!alive(pid)) return;
  process.kill(pid, "SIGINT");
  const until = Date.now() + ms;
  while (alive(pid) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
}
