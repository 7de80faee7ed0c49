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
  // CRW_BENCH_STATEMENTS=list: each statement's count by its text, into `<file>.list`
  const byText = process.env.CRW_BENCH_STATEMENTS === "list" ? new Map() : null;
  pg.Client.prototype.query = function counted(...args) {
    statements++;
    if (byText) {
      const q = args[0];
      const text = String(typeof q === "string" ? q : (q?.text ?? q?.name ?? "?"));
      const key = text.replace(/\s+/g, " ").slice(0, 110);
      byText.set(key, (byText.get(key) ?? 0) + 1);
    }
    return query.apply(this, args);
  };
  process.once("exit", () => {
    writeFileSync(file, `${statements}\n`);
    if (byText)
      writeFileSync(
        `${file}.list`,
        [...byText]
          .sort((a, b) => b[1] - a[1])
          .map(([text, n]) => `${n}\t${text}`)
          .join("\n"),
      );
  });
}
