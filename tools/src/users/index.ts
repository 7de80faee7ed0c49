import { execFileSync, spawnSync } from "node:child_process";
import { chmodSync } from "node:fs";

/** An ordinary login user of this machine, for tests that must run something as someone other than root. */
export interface TestUser {
  readonly name: string;
  readonly uid: number;
  readonly gid: number;
  /** Its home directory, mode 0700 as a private home usually is. */
  readonly home: string;
}

export const isRoot = (): boolean => process.getuid?.() === 0;

const id = (flag: string, name: string): number | undefined => {
  const r = spawnSync("id", [flag, name], { encoding: "utf8" });
  return r.status === 0 ? Number(r.stdout.trim()) : undefined;
};

/**
 * The user `name`, made (with a 0700 home under /home) when missing. Only root can make one; parallel
 * test projects may race to make the same user, so a failed useradd is followed by a second look.
 */
export function ensureTestUser(name: string): TestUser {
  if (!isRoot()) throw new Error("only root can make a test user");
  const home = `/home/${name}`;
  if (id("-u", name) === undefined)
    spawnSync("useradd", ["--create-home", "--home-dir", home, "--shell", "/bin/bash", name], {
      stdio: "ignore",
    });
  const uid = id("-u", name);
  const gid = id("-g", name);
  if (uid === undefined || gid === undefined) throw new Error(`could not make the test user ${name}`);
  execFileSync("mkdir", ["-p", home]);
  execFileSync("chown", [`${uid}:${gid}`, home]);
  chmodSync(home, 0o700);
  return { name, uid, gid, home };
}
