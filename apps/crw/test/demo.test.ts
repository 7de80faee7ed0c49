import { spawnSync } from "node:child_process";
import { resolve } from "node:path";
import { describe, expect, it } from "vitest";

// The README's main job is `npm ci && npm run demo`: `npm run demo` builds, then runs tools/bin/demo.mjs
// against the built CLI. The build is this project's test dependency, so the test runs the script itself.
const root = resolve(import.meta.dirname, "../../..");

describe("npm run demo", () => {
  it("runs the daemon workflow with an expansion, a delegation and a crw flow run, offline, and stops the daemon", () => {
    const env = { ...process.env };
    delete env.DATABASE_URL;
    delete env.CRW_MODEL;
    const out = spawnSync(process.execPath, [resolve(root, "tools/bin/demo.mjs")], {
      cwd: root,
      env,
      encoding: "utf8",
      timeout: 240_000,
    });
    expect(out.status, `${out.stdout}\n${out.stderr}`).toBe(0);
    const text = out.stdout;
    expect(text).toMatch(/crw daemon ready at http:\/\/127\.0\.0\.1:\d+/);
    // the workflow: four declared nodes and the one added from inside plan's turn, all succeeded, one summary
    expect(text).toMatch(/Workflow "review-and-document" \([0-9a-f-]+\) completed, run 1\./);
    for (const node of ["plan", "api", "docs", "review", "release-notes"])
      expect(text).toMatch(new RegExp(`^- ${node}: succeeded$`, "m"));
    expect(text.match(/^Workflow "review-and-document"/gm)).toHaveLength(1);
    // the delegation's result, read back from the child
    expect(out.stderr).toContain("child session started");
    expect(text).toMatch(/^Three risks: locks, long rewrites, no rollback path\.$/m);
    // every delegated turn ran in a forked runner
    expect(text).toMatch(/sub-agents: [1-9]\d*\/\d+ runners/);
    // agents at work: the isolated child's fix, committed by crw on its branch and landed; the workflow's files
    expect(text).toMatch(
      /committed on branch crw\/[0-9a-f]{12} at [0-9a-f]{12} \(1 file changed.*calc\.js\)/,
    );
    expect(text).toMatch(/^landed crw\/[0-9a-f]{12} into main at [0-9a-f]{12} \(fast-forward\)/m);
    expect(text).toMatch(
      /^-export const add = \(a, b\) => a - b;\n\+export const add = \(a, b\) => a \+ b;$/m,
    );
    expect(text).toMatch(
      /^check: landed crw\/[0-9a-f]{8} into main at [0-9a-f]{12} \(fast-forward\): CHANGELOG\.md, NOTES\.md$/m,
    );
    expect(text).toMatch(/^ CHANGELOG\.md \| 1 \+\n NOTES\.md {5}\| 1 \+$/m);
    expect(text).toMatch(/\$ git status --short\n\(clean\)/);
    expect(text).toMatch(/Workflow "notes-for-the-fix" \([0-9a-f-]+\) completed/);
    expect(text).toMatch(/^- check: succeeded\n {2}Both files are there and the test passes\.$/m);
    expect(text).toMatch(/\$ node test\.js\nPASS/);
    // crw flow on the local backend
    expect(text).toMatch(/^run release-notes-\S+ \(release-notes\): completed$/m);
    for (const call of ["plan.1", "draft.1", "draft.2", "write.1", "review.1"])
      expect(text).toMatch(new RegExp(`^  ${call.replace(".", "\\.")}\\s+\\w+\\s+completed`, "m"));
    expect(text).toMatch(/crw daemon \(pid \d+\) stopped/);
  }, 300_000);
});
