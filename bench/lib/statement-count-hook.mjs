// Loaded into a process a bench starts (`node --import` through NODE_OPTIONS): counts every statement the
// process sends through pg and writes the total to CRW_BENCH_STATEMENTS_FILE when it exits.
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const file = process.env.CRW_BENCH_STATEMENTS_FILE;
if (file) {
  // the pg the daemon loads: the repository's hoisted copy
  const pg = createRequire(new URL("../../apps/daemon/package.json", import.meta.url))("pg");
  const query = pg.Client.prototype.query;
  let statements = 0;
  pg.Client.prototype.query = function counted(...args) {
    statements++;
    return query.apply(this, args);
  };
  process.once("exit", () => writeFileSync(file, `${statements}\n`));
}
