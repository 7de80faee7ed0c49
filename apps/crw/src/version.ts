import { readFileSync } from "node:fs";

/** This CLI's version, from its package.json (beside dist/ and src/ alike). */
export function version(): string {
  const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as {
    version: string;
  };
  return pkg.version;
}
