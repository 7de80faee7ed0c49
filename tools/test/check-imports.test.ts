import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { afterEach, describe, expect, it } from "vitest";

const script = resolve(import.meta.dirname, "../bin/check-imports.mjs");
const repo = resolve(import.meta.dirname, "../..");
const roots: string[] = [];

function write(root: string, path: string, text: string): void {
  mkdirSync(dirname(join(root, path)), { recursive: true });
  writeFileSync(join(root, path), text);
}

/** A two-package workspace where `b` depends on `a`; `files` adds or overrides sources. */
function fixture(files: Record<string, string> = {}): string {
  const root = mkdtempSync(join(tmpdir(), "crw-imports-"));
  roots.push(root);
  write(root, "package.json", JSON.stringify({ workspaces: ["packages/*"] }));
  const manifest = (name: string, deps: Record<string, string> = {}) =>
    JSON.stringify({ name, exports: { ".": "./src/index.ts" }, dependencies: deps });
  write(root, "packages/a/package.json", manifest("@x/a"));
  write(root, "packages/b/package.json", manifest("@x/b", { "@x/a": "0" }));
  write(root, "packages/a/src/index.ts", "export const a = 1;\n");
  write(root, "packages/a/src/inner.ts", "export const inner = 1;\n");
  write(root, "packages/b/src/index.ts", 'import { a } from "@x/a";\nexport const b = a;\n');
  for (const [path, text] of Object.entries(files)) write(root, path, text);
  return root;
}

function check(root: string) {
  const r = spawnSync(process.execPath, [script, "--root", root], { encoding: "utf8" });
  return { code: r.status, out: r.stdout + r.stderr };
}

afterEach(() => {
  for (const root of roots.splice(0)) rmSync(root, { recursive: true, force: true });
});

describe("the package boundary check", () => {
  it("passes a workspace whose packages import each other through their entry", () => {
    expect(check(fixture())).toMatchObject({ code: 0 });
  });

  it("fails on a relative import into another package's src/", () => {
    const r = check(fixture({ "packages/b/src/deep.ts": 'export { inner } from "../../a/src/inner.js";\n' }));
    expect(r.code).toBe(1);
    expect(r.out).toContain("packages/b/src/deep.ts:1: deep import '../../a/src/inner.js'");
  });

  it("fails on a package subpath the exports map does not offer", () => {
    const r = check(
      fixture({ "packages/b/src/deep.ts": 'import { inner } from "@x/a/src/inner";\nvoid inner;\n' }),
    );
    expect(r.code).toBe(1);
    expect(r.out).toContain("@x/a exports only .");
  });

  it("fails on an import cycle between packages and names its hops", () => {
    const r = check(fixture({ "packages/a/src/back.ts": 'export const again = await import("@x/b");\n' }));
    expect(r.code).toBe(1);
    expect(r.out).toContain("import cycle between packages: @x/a -> @x/b -> @x/a");
    expect(r.out).toContain("packages/a/src/back.ts:1");
  });

  it("does not count a test's import as a runtime edge", () => {
    const r = check(fixture({ "packages/a/test/uses-b.test.ts": 'import { b } from "@x/b";\nvoid b;\n' }));
    expect(r.code).toBe(0);
  });

  it("passes on this repository", () => {
    expect(check(repo)).toMatchObject({ code: 0 });
  });
});
