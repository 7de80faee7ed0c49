import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { describe, expect, it } from "vitest";

/**
 * The e2e entry points as the repository declares them: the root package.json's scripts, the workspace
 * scripts they delegate to, the test files those run, and (at source level) what those suites assert.
 */
const root = resolve(import.meta.dirname, "../../..");
const rootPackage = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as {
  workspaces: string[];
  scripts: Record<string, string>;
};

/** Workspace name -> directory, from the root's workspace globs (`dir/*` or a plain directory). */
function workspaces(): Map<string, string> {
  const out = new Map<string, string>();
  for (const pattern of rootPackage.workspaces) {
    const dirs = pattern.endsWith("/*")
      ? readdirSync(join(root, pattern.slice(0, -2)), { withFileTypes: true })
          .filter((d) => d.isDirectory())
          .map((d) => join(root, pattern.slice(0, -2), d.name))
      : [join(root, pattern)];
    for (const dir of dirs) {
      const file = join(dir, "package.json");
      if (existsSync(file)) out.set((JSON.parse(readFileSync(file, "utf8")) as { name: string }).name, dir);
    }
  }
  return out;
}
const byName = workspaces();

/**
 * The test files a script runs: `npm run -w <ws> <script>` follows the workspace's own script; `-w <ws> --
 * vitest run <paths>` (or a workspace script `vitest run <paths>`) names paths under the workspace; a
 * directory stands for every *.test.ts under it.
 */
function testFilesOf(script: string, cwd = root, depth = 0): string[] {
  expect(depth, `script chain too deep: ${script}`).toBeLessThan(4);
  const workspace = /(?:-w|--workspace)[ =](\S+)/.exec(script)?.[1];
  const dir = workspace ? byName.get(workspace) : cwd;
  expect(dir, `workspace ${workspace} of '${script}'`).toBeDefined();
  const npmRun = /npm run (?:-w \S+ )?(\S+)$/.exec(script.trim());
  if (npmRun && workspace) {
    const pkg = JSON.parse(readFileSync(join(dir as string, "package.json"), "utf8")) as {
      scripts?: Record<string, string>;
    };
    const inner = pkg.scripts?.[npmRun[1] as string];
    expect(inner, `${workspace} has no script ${npmRun[1]}`).toBeDefined();
    return testFilesOf(inner as string, dir as string, depth + 1);
  }
  const vitest = /vitest run ((?:\S+\s*)+)$/.exec(script.split("&&").at(-1)?.trim() ?? "");
  expect(vitest, `'${script}' runs no vitest paths`).not.toBeNull();
  const paths = (vitest?.[1] ?? "")
    .split(/\s+/)
    .filter((p) => p && !p.startsWith("-"))
    .map((p) => join(dir as string, p));
  expect(paths.length, `'${script}' names no test path`).toBeGreaterThan(0);
  return paths.flatMap((p) => {
    expect(existsSync(p), `${relative(root, p)} (named by '${script}') exists`).toBe(true);
    if (!statSync(p).isDirectory()) return [p];
    const files = (readdirSync(p, { recursive: true }) as string[])
      .filter((f) => f.endsWith(".test.ts"))
      .map((f) => join(p, f));
    expect(files.length, `${relative(root, p)} holds test files`).toBeGreaterThan(0);
    return files;
  });
}

/** A suite's source with the local modules it imports (helpers, harnesses), transitively. */
function sourcesOf(file: string, seen = new Set<string>()): string[] {
  if (seen.has(file)) return [];
  seen.add(file);
  const text = readFileSync(file, "utf8");
  const local = [...text.matchAll(/from "(\.{1,2}\/[^"]+)\.js"/g)]
    .map((m) => resolve(dirname(file), `${m[1]}.ts`))
    .filter((f) => existsSync(f) && f.includes(`${"/"}test${"/"}`));
  return [text, ...local.flatMap((f) => sourcesOf(f, seen))];
}

/** Reading a runner switch from the environment: any variable whose name carries RUNNER. */
const RUNNER_ENV_READ =
  /process\.env(?:\.[A-Z0-9_]*RUNNER[A-Z0-9_]*|\[\s*["'`][A-Z0-9_]*RUNNER[A-Z0-9_]*["'`]\s*\])/;
/** An assertion that a runner placement was used (placement counts, placement lists, placement names). */
const RUNNER_USE_ASSERTED = [
  /expect\([^;]*placements?\.runner\)\.toBeGreaterThan\(0\)/,
  /expect\(placements\)\.toEqual\(\[[^\]]*"runner"[^\]]*\]\)/,
  /expect\([^;]*placement === "runner"\)\)\.toBe\(true\)/,
];

/** Whether a suite asserts runner use on a statement of its own, not under an `if` that may skip it. */
function assertsRunnerUse(text: string): boolean {
  const lines = text.split("\n");
  return lines.some((line, i) => {
    if (!RUNNER_USE_ASSERTED.some((re) => re.test(line))) return false;
    const before = (lines[i - 1] ?? "").trim();
    return !/^\s*(?:if|else|\}\s*else)\b/.test(line) && !/^(?:if|else|\}\s*else)\b.*[^;{]$/.test(before);
  });
}

const E2E = [
  "test:e2e:subagent",
  "test:e2e:recovery",
  "test:e2e:parity",
  "test:e2e:parity:mcp",
  "test:e2e:parity:mcp:deferred",
] as const;

describe("the e2e scripts", () => {
  it("test:e2e:subagent, :recovery, :parity, :parity:mcp and :parity:mcp:deferred exist, each runs existing test files, and those suites assert runner use unconditionally without reading a runner switch (S004-445 S004-443)", () => {
    for (const name of E2E) {
      const script = rootPackage.scripts[name];
      expect(script, `root package.json script ${name}`).toBeDefined();
      const files = testFilesOf(script as string);
      expect(files.length, name).toBeGreaterThan(0);
      for (const file of files) {
        const sources = sourcesOf(file);
        const where = `${name}: ${relative(root, file)}`;
        for (const text of sources)
          expect(RUNNER_ENV_READ.test(text), `${where} reads a runner switch`).toBe(false);
        for (const text of sources) expect(text, where).not.toContain("ELOWEN_SUBAGENT_RUNNER");
        expect(assertsRunnerUse(sources[0] as string), `${where} asserts that a runner was used`).toBe(true);
      }
    }
  });

  it("no :runner script variants remain and no source reads ELOWEN_SUBAGENT_RUNNER (S004-444)", () => {
    const scripts = [
      ...Object.keys(rootPackage.scripts),
      ...[...byName.values()].flatMap((dir) =>
        Object.keys(
          (JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as { scripts?: object }).scripts ?? {},
        ),
      ),
    ];
    expect(scripts.filter((s) => /:runner$/.test(s))).toEqual([]);
    const offenders: string[] = [];
    for (const dir of byName.values()) {
      const src = join(dir, "src");
      if (!existsSync(src)) continue;
      for (const f of readdirSync(src, { recursive: true }) as string[])
        if (
          /\.(ts|mts|mjs|js)$/.test(f) &&
          readFileSync(join(src, f), "utf8").includes("ELOWEN_SUBAGENT_RUNNER")
        )
          offenders.push(relative(root, join(src, f)));
    }
    expect(offenders).toEqual([]);
  });

  it("the source checks catch a suite that reads a runner switch, asserts no runner use or asserts it only conditionally", () => {
    expect(RUNNER_ENV_READ.test('if (process.env.CRW_SUBAGENT_RUNNER === "1")')).toBe(true);
    expect(RUNNER_ENV_READ.test('const on = process.env["ELOWEN_SUBAGENT_RUNNER"]')).toBe(true);
    expect(RUNNER_ENV_READ.test("process.env[FAKE_KEY_ENV] = 'k'")).toBe(false);
    expect(
      RUNNER_USE_ASSERTED.some((re) => re.test("expect(run.placements.runner).toBeGreaterThan(0);")),
    ).toBe(true);
    expect(RUNNER_USE_ASSERTED.some((re) => re.test("expect(run.placements.runner).toBe(0);"))).toBe(false);
    expect(assertsRunnerUse("    expect(run.placements.runner).toBeGreaterThan(0);")).toBe(true);
    // an assertion an `if` may skip is no unconditional runner use
    expect(
      assertsRunnerUse("    if (resumed > 0)\n      expect(after.placements.runner).toBeGreaterThan(0);"),
    ).toBe(false);
    expect(assertsRunnerUse("    if (resumed > 0) expect(after.placements.runner).toBeGreaterThan(0);")).toBe(
      false,
    );
  });
});
