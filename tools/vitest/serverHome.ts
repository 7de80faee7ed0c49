import { chmodSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";

/**
 * Under root, every embedded PostgreSQL cluster a daemon of the tests makes for a data directory of its own
 * is placed under the server user's home (`CRW_POSTGRES_HOME`, /var/lib/crw-postgres by default), and the
 * data directory is a link to it: removing the test's directory leaves the cluster behind, 50 MB each,
 * fifteen or so a run. A run gets a home of its own, removed when the run ends, so that no test cluster
 * outlives it and no test touches the clusters of the machine's own daemons. Set by the caller, the
 * variable is left alone.
 */
export default function setup(): () => void {
  if (process.getuid?.() !== 0 || process.env.CRW_POSTGRES_HOME) return () => {};
  const base = resolve("/var/lib/crw-postgres");
  mkdirSync(base, { recursive: true, mode: 0o755 });
  // A short name: a cluster's Unix socket lives in its directory below this home, and a socket path longer
  // than 107 bytes makes the server listen on TCP alone.
  const home = mkdtempSync(join(base, "t"));
  // The server user runs the binaries copied here and enters the clusters below: searchable by everyone, as
  // the default home is (mkdtemp makes it 0700). A test run nested in this one inherits the variable.
  chmodSync(home, 0o755);
  process.env.CRW_POSTGRES_HOME = home;
  const remove = () => {
    delete process.env.CRW_POSTGRES_HOME;
    rmSync(home, { recursive: true, force: true });
  };
  // A runner that never calls the teardown (a mutation tool's vitest runner) still removes it at its exit.
  process.once("exit", remove);
  return () => {
    process.off("exit", remove);
    remove();
  };
}
