#!/usr/bin/env node
// Package boundary check, run by `npm run lint`. Fails on
//  - an import that reaches into another workspace package's src/ or dist/ by path (`../../db/src/x.js`) or through a
//    subpath its exports map does not offer (`@crw/db/src/x`), and
//  - an import cycle between packages, counting runtime imports (sources, not tests) and `dependencies`.
// Usage: check-imports.mjs [--root DIR]
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve, sep } from "node:path";

const args = process.argv.slice(2);
const root = resolve(args[0] === "--root" && args[1] ? args[1] : process.cwd());

const SOURCE = /\.(m|c)?(t|j)sx?$/;
const SKIP_DIRS = new Set(["node_modules", "dist", ".nx", ".reports", "generated", "coverage"]);
const IMPORT =
  /(?:^|[^.\w$])(?:import|export)\s*(?:[\w*{}\s,$]+from\s*)?["']([^"']+)["']|\b(?:import|require)\s*\(\s*["']([^"']+)["']\s*\)/g;

function workspaces() {
  const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
  const dirs = [];
  for (const pattern of pkg.workspaces ?? []) {
    if (pattern.endsWith("/*")) {
      const base = join(root, pattern.slice(0, -2));
      if (!existsSync(base)) continue;
      for (const d of readdirSync(base))
        if (existsSync(join(base, d, "package.json"))) dirs.push(join(base, d));
    } else if (existsSync(join(root, pattern, "package.json"))) dirs.push(join(root, pattern));
  }
  return dirs.map((dir) => {
    const manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
    return { dir, name: manifest.name, manifest };
  });
}

function* files(dir) {
  for (const entry of readdirSync(dir)) {
    if (SKIP_DIRS.has(entry) || entry.startsWith(".")) continue;
    const p = join(dir, entry);
    if (statSync(p).isDirectory()) yield* files(p);
    else if (SOURCE.test(entry) && !entry.endsWith(".d.ts")) yield p;
  }
}

const isTestFile = (pkgDir, file) => {
  const rel = relative(pkgDir, file).split(sep);
  return (
    rel[0] === "test" ||
    rel[0] === "bench" ||
    /\.(test|spec)\.[mc]?[tj]sx?$/.test(file) ||
    /\.config\.[mc]?[tj]s$/.test(file)
  );
};

const packages = workspaces();
const byName = new Map(packages.map((p) => [p.name, p]));
const owner = (file) => packages.find((p) => file === p.dir || file.startsWith(p.dir + sep));
const problems = [];
const edges = new Map(packages.map((p) => [p.name, new Map()]));

const addEdge = (from, to, where) => {
  if (from !== to && !edges.get(from).has(to)) edges.get(from).set(to, where);
};

for (const pkg of packages) {
  for (const dep of Object.keys(pkg.manifest.dependencies ?? {}))
    if (byName.has(dep))
      addEdge(pkg.name, dep, `${relative(root, join(pkg.dir, "package.json"))} dependencies`);
  for (const file of files(pkg.dir)) {
    const text = readFileSync(file, "utf8");
    const runtime = !isTestFile(pkg.dir, file);
    for (const m of text.matchAll(IMPORT)) {
      const spec = m[1] ?? m[2];
      const line = text.slice(0, m.index).split("\n").length;
      const where = `${relative(root, file)}:${line}`;
      if (spec.startsWith(".")) {
        const target = resolve(dirname(file), spec);
        const other = owner(target);
        const inner = other && relative(other.dir, target).split(sep)[0];
        if (other && other !== pkg && (inner === "src" || inner === "dist"))
          problems.push(
            `${where}: deep import '${spec}' reaches into ${other.name}'s ${inner}/; import '${other.name}' instead`,
          );
        continue;
      }
      const bare = spec.startsWith("@") ? spec.split("/").slice(0, 2).join("/") : spec.split("/")[0];
      const target = byName.get(bare);
      if (!target) continue;
      const subpath = `.${spec.slice(bare.length)}`;
      const offered = target.manifest.exports ? Object.keys(target.manifest.exports) : ["."];
      if (!offered.includes(subpath))
        problems.push(`${where}: deep import '${spec}': ${target.name} exports only ${offered.join(", ")}`);
      if (runtime) addEdge(pkg.name, target.name, where);
    }
  }
}

// Cycle search over the package graph (depth-first, reporting each cycle once by its smallest rotation).
const seen = new Set();
const reported = new Set();
const stack = [];
function visit(name) {
  const at = stack.indexOf(name);
  if (at >= 0) {
    const cycle = stack.slice(at);
    const start = cycle.indexOf([...cycle].sort()[0]);
    const key = [...cycle.slice(start), ...cycle.slice(0, start)].join(" -> ");
    if (!reported.has(key)) {
      reported.add(key);
      const hops = cycle.map(
        (n, i) =>
          `  ${n} -> ${cycle[(i + 1) % cycle.length]} (${edges.get(n).get(cycle[(i + 1) % cycle.length])})`,
      );
      problems.push(`import cycle between packages: ${key} -> ${cycle[start]}\n${hops.join("\n")}`);
    }
    return;
  }
  if (seen.has(name)) return;
  stack.push(name);
  for (const next of edges.get(name).keys()) visit(next);
  stack.pop();
  seen.add(name);
}
for (const p of packages) visit(p.name);

if (problems.length > 0) {
  process.stderr.write(`${problems.join("\n")}\n${problems.length} package boundary problem(s)\n`);
  process.exit(1);
}
process.stdout.write(`package boundaries ok (${packages.length} packages)\n`);
