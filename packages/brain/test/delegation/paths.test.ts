import { mkdtempSync, realpathSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { checkChildToolCall } from "../../src/agent/index.js";
import { captureDelegatedExecutionScope, parseDelegatedExecutionScope } from "../../src/scope/index.js";

const workDir = realpathSync(mkdtempSync(join(tmpdir(), "crw-paths-")));
afterAll(() => rmSync(workDir, { recursive: true, force: true }));

const scope = (allow?: string[]) =>
  parseDelegatedExecutionScope(
    captureDelegatedExecutionScope({
      accountId: "acct",
      target: { kind: "host", ref: null },
      workDir,
      ...(allow ? { tools: { allow, deny: [] } } : {}),
    }),
  );

describe("per-call path checks", () => {
  it("a call's path authority comes from the scope's working directory, never from the process cwd (S004-272)", () => {
    // The process runs elsewhere: its cwd is neither the working directory nor inside it.
    expect(process.cwd().startsWith(workDir)).toBe(false);
    const options = { workDir, scope: scope(["read(src/**)", "write(src/**)", "shell"]) };
    const placed = checkChildToolCall(options, "read", { path: "src/a.ts" });
    expect(placed.absolutePath).toBe(join(workDir, "src/a.ts"));
    expect(placed.subject).toBe("src/a.ts");
    // A file of the process cwd, by absolute path or by a relative path that climbs out, is outside.
    for (const path of [
      join(process.cwd(), "package.json"),
      "../package.json",
      join(process.cwd(), "src/a.ts"),
    ]) {
      expect(() => checkChildToolCall(options, "read", { path })).toThrowError(
        expect.objectContaining({ code: "outside_work_dir" }),
      );
    }
    // The argument pattern matches the path relative to the working directory, not a suffix of any path.
    expect(() => checkChildToolCall(options, "write", { path: "/elsewhere/src/a.ts" })).toThrowError(
      expect.objectContaining({ code: "outside_work_dir" }),
    );
    expect(() => checkChildToolCall(options, "write", { path: "docs/a.md" })).toThrowError(
      expect.objectContaining({ code: "tool_not_allowed" }),
    );
    // The same call under another working directory resolves there: nothing is derived from where the process is.
    const other = realpathSync(mkdtempSync(join(tmpdir(), "crw-paths-other-")));
    try {
      const moved = checkChildToolCall({ ...options, workDir: other }, "read", { path: "src/a.ts" });
      expect(moved.absolutePath).toBe(join(other, "src/a.ts"));
    } finally {
      rmSync(other, { recursive: true, force: true });
    }
  });
});
