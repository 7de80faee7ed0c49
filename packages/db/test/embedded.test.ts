import { execFileSync, spawn, spawnSync } from "node:child_process";
import {
  chmodSync,
  cpSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { ensureTestUser, isRoot, type TestUser } from "@crw/tools/users";
import { afterAll, describe, expect, it } from "vitest";
import { binariesFor, shippedBinaries } from "../src/embedded/binaries.js";
import { EmbeddedPostgresError, startEmbeddedCluster } from "../src/index.js";

const starter = resolve(import.meta.dirname, "support/start-cluster.mjs");
/**
 * Root runs the non-root cases as an ordinary user made for them, which must be able to read this checkout
 * to run its code: not so when root's checkout is under a private directory (the README's commands are
 * proven from such a clone elsewhere, and there only root's own cases can run).
 */
const asOrdinaryUser = (() => {
  if (!isRoot()) return { runs: true, user: undefined };
  const user = ensureTestUser("crw-test-user");
  const r = spawnSync("test", ["-r", starter], { uid: user.uid, gid: user.gid });
  return { runs: r.status === 0, user };
})();
const made: string[] = [];
const privateDir = (prefix: string) => {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  made.push(dir);
  return dir;
};
afterAll(() => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

interface Started {
  serverUid?: number;
  runsAs?: string;
  sqlUser?: string;
  error?: { name: string; reason: string; message: string };
}

/** The starter script run as `user` (or as this process's user): a real process, as a user would run it. */
function startAs(
  user: TestUser | undefined,
  dataDir: string,
  mode = "throwaway",
  env: NodeJS.ProcessEnv = {},
): Started {
  const r = spawnSync(process.execPath, [starter, dataDir, mode], {
    encoding: "utf8",
    timeout: 120_000,
    cwd: "/",
    env: { ...process.env, ...env, ...(user && { HOME: user.home }) },
    ...(user && { uid: user.uid, gid: user.gid }),
  });
  const line = r.stdout.trim().split("\n").at(-1) ?? "";
  if (!line.startsWith("{")) throw new Error(`the starter printed nothing: ${r.stderr}`);
  return JSON.parse(line) as Started;
}

const ancestors = (path: string): string[] => {
  const out: string[] = [];
  for (let p = dirname(path); ; p = dirname(p)) {
    out.push(p);
    if (p === dirname(p)) return out;
  }
};
const modes = (paths: string[]) =>
  paths.map((p) => `${p} ${statSync(p).mode.toString(8)} ${statSync(p).uid}`);

describe("the embedded PostgreSQL starter", () => {
  it.runIf(asOrdinaryUser.runs)(
    "a non-root user runs the server as itself, in a data directory under its private home",
    () => {
      // As root the non-root case runs as an ordinary user made for it; otherwise as the user running the tests.
      const user = asOrdinaryUser.user;
      const home = user?.home ?? privateDir("crw-home-");
      const dataDir = join(home, `pg-${process.pid}`, "data");
      const started = startAs(user, dataDir);
      expect(started.error).toBeUndefined();
      expect(started.serverUid).toBe(user?.uid ?? process.getuid?.());
      expect(started.runsAs).toBe("the invoking user");
      expect(statSync(home).mode & 0o777).toBe(0o700);
      rmSync(dirname(dataDir), { recursive: true, force: true });
    },
  );

  it.runIf(isRoot())(
    "root runs it as an unprivileged user and no directory above the data directory is opened",
    async () => {
      const parent = privateDir("crw-private-");
      const dataDir = join(parent, "deep", "data");
      mkdirSync(dirname(dataDir), { mode: 0o700 });
      const before = modes(ancestors(dataDir));
      const cluster = await startEmbeddedCluster({ dataDir, persistent: true });
      try {
        expect(modes(ancestors(dataDir))).toEqual(before);
        const pid = Number(
          execFileSync("head", ["-1", join(dataDir, "postmaster.pid")], { encoding: "utf8" }),
        );
        expect(statSync(`/proc/${pid}`).uid).not.toBe(0);
        expect(cluster.runsAs).not.toBe("the invoking user");
        // The cluster lives where its user can reach it, owned by that user and private to it.
        const real = lstatSync(dataDir).isSymbolicLink()
          ? resolve(dirname(dataDir), readLink(dataDir))
          : dataDir;
        expect(statSync(real).uid).toBe(statSync(`/proc/${pid}`).uid);
        expect(statSync(real).mode & 0o777).toBe(0o700);
      } finally {
        await cluster.stop();
      }
      // A second start finds the same cluster through the same path.
      const again = await startEmbeddedCluster({ dataDir, persistent: false });
      await again.stop();
      expect(existsSync(dataDir)).toBe(false);
    },
  );

  it.runIf(isRoot())(
    "root: a cluster left by a removed data directory is set aside, and a fresh start there makes a new one",
    async () => {
      const parent = privateDir("crw-orphan-");
      const dataDir = join(parent, "data");
      const first = await startEmbeddedCluster({ dataDir, persistent: true, password: "first", fresh: true });
      const target = resolve(dirname(dataDir), readLink(dataDir));
      await first.stop();
      // the user removes its data directory (here: the link) and starts again with a new password
      rmSync(dataDir, { recursive: true, force: true });
      expect(existsSync(target)).toBe(true);
      const second = await startEmbeddedCluster({
        dataDir,
        persistent: true,
        password: "second",
        fresh: true,
      });
      try {
        expect(second.setAside).toMatch(/\.orphaned-\d+$/);
        expect(existsSync(join(second.setAside as string, "PG_VERSION"))).toBe(true);
        const { default: pg } = await import("pg");
        const client = new pg.Client({ connectionString: second.url() });
        await client.connect();
        expect((await client.query("select 1 as one")).rows[0]).toEqual({ one: 1 });
        await client.end();
      } finally {
        await second.stop();
        rmSync(second.setAside as string, { recursive: true, force: true });
        rmSync(target, { recursive: true, force: true });
      }
    },
  );

  it.runIf(isRoot())(
    "root copies binaries its server user cannot reach, once, and reuses the copy",
    async () => {
      const shipped = await shippedBinaries();
      const checkout = privateDir("crw-checkout-");
      const root = join(checkout, "native");
      cpSync(shipped.root, root, { recursive: true, verbatimSymlinks: true });
      const home = privateDir("crw-server-home-");
      chmodSync(home, 0o755);
      const user = ensureTestUser("crw-test-user");
      const copied = await binariesFor(
        user,
        { ...shipped, root, postgres: join(root, "bin/postgres"), initdb: join(root, "bin/initdb") },
        home,
      );
      expect(copied.root).toBe(join(home, "server", shipped.version));
      expect(statSync(copied.root).uid).toBe(0);
      const r = spawnSync(copied.postgres, ["--version"], { uid: user.uid, gid: user.gid, encoding: "utf8" });
      expect(r.stdout).toMatch(/PostgreSQL/);
      const firstCopy = statSync(copied.postgres).ino;
      const reused = await binariesFor(
        user,
        { ...shipped, root, postgres: join(root, "bin/postgres"), initdb: join(root, "bin/initdb") },
        home,
      );
      expect(reused.root).toBe(copied.root);
      expect(statSync(reused.postgres).ino).toBe(firstCopy);
      expect(readdirSync(join(home, "server"))).toEqual([shipped.version]);
      // Binaries it can reach are used where they are.
      expect((await binariesFor(user, copied, join(home, "other"))).root).toBe(copied.root);
    },
  );
});

describe("an embedded PostgreSQL that cannot start says why", () => {
  const expectTyped = async (p: Promise<unknown>, reason: string, words: RegExp) => {
    const e = await p.then(
      () => undefined,
      (x: unknown) => x,
    );
    expect(e).toBeInstanceOf(EmbeddedPostgresError);
    expect((e as EmbeddedPostgresError).reason).toBe(reason);
    expect((e as Error).message).toMatch(words);
  };

  it.runIf(isRoot())(
    "root with no user to run the server as, or one that is root, is a server_user error",
    async () => {
      const dataDir = join(privateDir("crw-nouser-"), "data");
      await expectTyped(
        startEmbeddedCluster({ dataDir, persistent: false, env: { CRW_POSTGRES_USER: "crw-no-such-user" } }),
        "server_user",
        /no user 'crw-no-such-user'.*CRW_POSTGRES_USER/,
      );
      await expectTyped(
        startEmbeddedCluster({ dataDir, persistent: false, env: { CRW_POSTGRES_USER: "root" } }),
        "server_user",
        /refuses to run as root/,
      );
      expect(existsSync(dataDir)).toBe(false);
    },
  );

  it.runIf(isRoot())(
    "binaries that can only be copied to a file system mounted noexec are a binaries error",
    async () => {
      const shipped = await shippedBinaries();
      const checkout = privateDir("crw-noexec-checkout-");
      const root = join(checkout, "native");
      cpSync(shipped.root, root, { recursive: true, verbatimSymlinks: true });
      const mount = privateDir("crw-noexec-");
      execFileSync("mount", ["-t", "tmpfs", "-o", "noexec,size=256m", "tmpfs", mount]);
      try {
        const user = ensureTestUser("crw-test-user");
        const unreachable = {
          ...shipped,
          root,
          postgres: join(root, "bin/postgres"),
          initdb: join(root, "bin/initdb"),
        };
        await expectTyped(
          binariesFor(user, unreachable, mount),
          "binaries",
          /cannot be executed as crw-test-user .*noexec/s,
        );
      } finally {
        execFileSync("umount", [mount]);
      }
    },
  );

  it("a data directory in the way (a file, or files that are no cluster) is a data_dir error and is left alone", async () => {
    const parent = privateDir("crw-inway-");
    const file = join(parent, "file");
    writeFileSync(file, "mine");
    await expectTyped(
      startEmbeddedCluster({ dataDir: file, persistent: false }),
      "data_dir",
      /not a directory/,
    );
    const notes = join(parent, "notes");
    mkdirSync(notes);
    writeFileSync(join(notes, "a.txt"), "mine");
    await expectTyped(
      startEmbeddedCluster({ dataDir: notes, persistent: false }),
      "data_dir",
      /holds files but no PostgreSQL cluster/,
    );
    expect(readdirSync(notes)).toEqual(["a.txt"]);
  });

  it.runIf(asOrdinaryUser.runs)(
    "a user who may not write the data directory gets a data_dir error from a real process, exit 1",
    () => {
      const user = asOrdinaryUser.user;
      // A root-owned private directory for the test user; for a non-root run, a directory made read-only.
      const locked = privateDir("crw-locked-");
      if (!user) chmodSync(locked, 0o500);
      const r = startAs(user, join(locked, "data"));
      chmodSync(locked, 0o700);
      expect(r.error?.name).toBe("EmbeddedPostgresError");
      expect(r.error?.reason).toBe("data_dir");
      expect(r.error?.message).toMatch(/cannot prepare .*data.*EACCES/);
    },
  );
});

describe("a cluster is never left half-made", () => {
  it("initdb killed with its starter leaves nothing a later start takes for a cluster; that start makes a whole one", async () => {
    const parent = privateDir("crw-initkill-");
    const dataDir = join(parent, "data");
    const child = spawn(process.execPath, [starter, dataDir, "keep"], { detached: true, stdio: "ignore" });
    // The staging directory appears when initdb starts; SIGKILL the starter and initdb together then.
    const staging = () => {
      const target = lstatSync(dataDir, { throwIfNoEntry: false })?.isSymbolicLink()
        ? readLink(dataDir)
        : dataDir;
      const where = dirname(target);
      const prefix = `${basename(target)}.initdb-`;
      return existsSync(where) ? readdirSync(where).filter((n) => n.startsWith(prefix)) : [];
    };
    const until = Date.now() + 30_000;
    while (staging().length === 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 5));
    expect(staging().length).toBeGreaterThan(0);
    process.kill(-(child.pid as number), "SIGKILL");
    await new Promise((r) => child.once("exit", r));
    const cluster = await startEmbeddedCluster({ dataDir, persistent: false });
    try {
      expect(staging()).toEqual([]);
    } finally {
      await cluster.stop();
    }
  });
});

function readLink(path: string): string {
  return execFileSync("readlink", [path], { encoding: "utf8" }).trim();
}
