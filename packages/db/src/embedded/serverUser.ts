import { stat } from "node:fs/promises";
import { join } from "node:path";
import { EmbeddedPostgresError, EXTERNAL_SERVER_HINT } from "./errors.js";
import { run, type ServerUser } from "./run.js";

/** The unprivileged user root runs embedded servers as, unless `CRW_POSTGRES_USER` names another. */
export const DEFAULT_SERVER_USER = "crw-postgres";

async function lookup(name: string): Promise<ServerUser | undefined> {
  const [uid, gid] = await Promise.all([run("id", ["-u", name]), run("id", ["-g", name])]);
  if (uid.code !== 0 || gid.code !== 0) return undefined;
  return { name, uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
}

async function nameOf(uid: number): Promise<string> {
  const ran = await run("id", ["-nu", String(uid)]);
  return ran.code === 0 ? ran.stdout.trim() : String(uid);
}

/** A system account with no home, no login shell and a group of its own: it only ever runs the server. */
async function createSystemUser(name: string): Promise<string | undefined> {
  const ran = await run("useradd", [
    "--system",
    "--user-group",
    "--no-create-home",
    "--home-dir",
    "/nonexistent",
    "--shell",
    "/usr/sbin/nologin",
    name,
  ]);
  if (ran.code === 0) return undefined;
  return ran.spawnError
    ? `useradd could not run (${ran.spawnError.code})`
    : ran.stderr.trim() || `exit ${ran.code}`;
}

/**
 * Who the server on `dataDir` runs as: the invoking user unless that is root (undefined), since only root
 * needs another user. As root: the owner of a cluster already in `dataDir` (so an existing cluster keeps its
 * owner), else `CRW_POSTGRES_USER` or `crw-postgres`, made as a system user on first use. Several processes
 * may make it at once (parallel test projects): a failed useradd is followed by a second look.
 */
export async function serverUserFor(
  dataDir: string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<ServerUser | undefined> {
  if (process.getuid?.() !== 0) return undefined;
  const existing = await stat(join(dataDir, "PG_VERSION")).catch(() => undefined);
  if (existing && existing.uid !== 0)
    return { name: await nameOf(existing.uid), uid: existing.uid, gid: existing.gid };
  const name = env.CRW_POSTGRES_USER || DEFAULT_SERVER_USER;
  let user = await lookup(name);
  let why: string | undefined;
  if (!user && !env.CRW_POSTGRES_USER) {
    why = await createSystemUser(name);
    user = await lookup(name);
  }
  if (!user)
    throw new EmbeddedPostgresError(
      "server_user",
      `PostgreSQL cannot run as root and there is no user '${name}' to run it as${why ? ` (${why})` : ""}: ` +
        `create an unprivileged user and set CRW_POSTGRES_USER to its name, ${EXTERNAL_SERVER_HINT}`,
      { user: name },
    );
  if (user.uid === 0)
    throw new EmbeddedPostgresError(
      "server_user",
      `CRW_POSTGRES_USER names '${name}', which is root; PostgreSQL refuses to run as root: name an unprivileged user`,
      { user: name },
    );
  return user;
}
