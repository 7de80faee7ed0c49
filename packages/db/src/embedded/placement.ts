import { createHash, randomBytes } from "node:crypto";
import { chmod, lstat, mkdir, readdir, readlink, rename, rmdir, stat, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { EmbeddedPostgresError, EXTERNAL_SERVER_HINT } from "./errors.js";
import { type ServerUser, userCan } from "./run.js";

/** Where root keeps what its server user needs (binaries, clusters it cannot place in place). */
export const serverHome = (env: NodeJS.ProcessEnv = process.env): string =>
  resolve(env.CRW_POSTGRES_HOME || "/var/lib/crw-postgres");

/** A directory root owns and everyone may search: the server user reaches what is below it, nothing more. */
async function rootDir(path: string): Promise<string> {
  await mkdir(path, { recursive: true, mode: 0o755 });
  await chmod(path, 0o755);
  return path;
}

const exists = (path: string) =>
  lstat(path).then(
    (s) => s,
    () => undefined,
  );

/** A private directory above `dataDir`: the cluster lives elsewhere and `dataDir` is a link to it. */
async function relocated(
  dataDir: string,
  persistent: boolean,
  user: ServerUser,
  env: NodeJS.ProcessEnv,
  fresh: boolean,
): Promise<{ pgData: string; setAside?: string }> {
  let base: string;
  let name: string;
  if (persistent) {
    // The same data directory always maps to the same place, so a lost link is found again.
    const digest = createHash("sha256").update(resolve(dataDir)).digest("hex").slice(0, 16);
    base = await rootDir(join(await rootDir(serverHome(env)), "clusters"));
    name = `${basename(dirname(resolve(dataDir)))}-${digest}`;
  } else {
    const tmp = tmpdir();
    base = (await userCan(user, "-x", tmp))
      ? tmp
      : await rootDir(join(await rootDir(serverHome(env)), "tmp"));
    name = `crw-pg-${randomBytes(6).toString("hex")}`;
  }
  const target = join(base, name);
  // A cluster found at the mapped place while its caller holds no record of one (its password is new) was
  // left by a data directory that was removed: reusing it would fail on that password. It is kept, aside.
  let setAside: string | undefined;
  if (persistent && fresh && (await exists(target))) {
    setAside = `${target}.orphaned-${Date.now()}`;
    await rename(target, setAside);
  }
  await symlink(target, dataDir);
  return { pgData: target, ...(setAside && { setAside }) };
}

/**
 * What is at `dataDir` now: nothing, a link (root's relocated cluster), an empty directory, or a cluster.
 * Anything else is in the way and refused, so that no file of the user's is taken over or overwritten.
 */
export async function dataDirState(dataDir: string): Promise<"absent" | "link" | "empty" | "cluster"> {
  const here = await exists(dataDir);
  if (!here) return "absent";
  if (here.isSymbolicLink()) return "link";
  if (!here.isDirectory())
    throw new EmbeddedPostgresError("data_dir", `${dataDir} is not a directory`, { dataDir });
  const held = await readdir(dataDir);
  if (held.includes("PG_VERSION")) return "cluster";
  if (held.length === 0) return "empty";
  throw new EmbeddedPostgresError(
    "data_dir",
    `${dataDir} holds files but no PostgreSQL cluster: remove it or choose another data directory`,
    { dataDir },
  );
}

/**
 * The directory, reachable by `user`, where the cluster named by `dataDir` lives (it may not exist yet:
 * initdb makes it). `dataDir` itself when `user` can search its parent; else (a parent such as a 0700 home
 * or a `mktemp -d`) a directory under the server home, with `dataDir` a link to it. The invoking user's
 * directories are never opened to others: no mode above `dataDir` changes.
 */
export async function placeDataDir(
  user: ServerUser,
  dataDir: string,
  persistent: boolean,
  env: NodeJS.ProcessEnv = process.env,
  /** The caller holds no record of a cluster here: one found at root's mapped place is an orphan. */
  fresh = false,
): Promise<{ pgData: string; setAside?: string }> {
  const here = await dataDirState(dataDir);
  if (here === "link") return { pgData: resolve(dirname(dataDir), await readlink(dataDir)) };
  if (here === "cluster") {
    if (await userCan(user, "-x", dataDir)) return { pgData: dataDir };
    const owner = await stat(dataDir);
    throw new EmbeddedPostgresError(
      "data_dir",
      `the PostgreSQL cluster in ${dataDir} runs as ${user.name} (uid ${owner.uid}), who cannot reach it: a ` +
        `directory above it is private; move the cluster to a directory ${user.name} can reach, ${EXTERNAL_SERVER_HINT}`,
      { dataDir, user: user.name },
    );
  }
  if (here === "empty") await rmdir(dataDir);
  await mkdir(dirname(dataDir), { recursive: true, mode: 0o700 });
  if (await userCan(user, "-x", dirname(dataDir))) return { pgData: dataDir };
  return relocated(dataDir, persistent, user, env, fresh);
}
