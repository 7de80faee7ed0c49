import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  DelegatedScopeError,
  delegatedWorkDir,
  normalizePlacement,
  pathSpelling,
} from "../../src/scope/index.js";

const segment = fc.constantFrom("a", "b", "..", ".", "", "guest", "x y", "c:", "C:");
const posixPath = fc.array(segment, { maxLength: 8 }).map((s) => `/${s.join("/")}`);
const anyPath = fc.oneof(
  posixPath,
  fc.array(segment, { maxLength: 6 }).map((s) => s.join("/")),
  fc.array(segment, { maxLength: 6 }).map((s) => `C:\\${s.join("\\")}`),
  fc.array(segment, { maxLength: 6 }).map((s) => `C:${s.join("\\")}`),
  fc.array(segment, { maxLength: 6 }).map((s) => `\\${s.join("\\")}`),
  fc.array(segment, { maxLength: 6 }).map((s) => `\\\\srv\\share\\${s.join("\\")}`),
);

describe("placements never leave their root (property)", () => {
  it("a managed child's workDir is always inside its guest root, whatever `..` the cwd holds", async () => {
    await fc.assert(
      fc.asyncProperty(posixPath, async (cwd) => {
        try {
          const placed = await delegatedWorkDir(cwd, { kind: "managed", ref: "m", guestRoot: "/guest/a" });
          expect(placed.workDir === "/guest/a" || placed.workDir.startsWith("/guest/a/")).toBe(true);
          expect(placed.workDir.split("/")).not.toContain("..");
        } catch (e) {
          expect(e).toBeInstanceOf(DelegatedScopeError);
        }
      }),
      { numRuns: 400 },
    );
  });

  it("host and managed targets accept only POSIX spellings; ambiguous Windows spellings are refused for every target", () => {
    fc.assert(
      fc.property(anyPath, (path) => {
        const spelling = pathSpelling(path);
        for (const target of ["host", "managed", "local"] as const) {
          const placed = normalizePlacement(path, target);
          if (spelling === "drive-relative" || spelling === "current-drive" || spelling === "relative")
            expect(placed.ok).toBe(false);
          if (target !== "local" && spelling !== "posix") expect(placed.ok).toBe(false);
          if (placed.ok && spelling === "posix") expect(placed.path.split("/")).not.toContain("..");
          // Normalizing is idempotent: a stored placement reads back as itself.
          if (placed.ok) expect(normalizePlacement(placed.path, target)).toEqual(placed);
        }
      }),
      { numRuns: 500 },
    );
  });

  it("UNC needs a real server and share: dot and device segments are refused, so a placement reads back as itself", () => {
    for (const path of ["//./..", "\\\\.\\..", "\\\\?\\C:\\x", "//../share/x", "//srv/../x"]) {
      expect(normalizePlacement(path, "local").ok).toBe(false);
    }
    expect(normalizePlacement("\\\\srv\\share\\dir\\..\\x", "local")).toEqual({
      ok: true,
      path: "\\\\srv\\share\\x",
    });
  });
});
