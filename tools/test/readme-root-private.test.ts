import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { isRoot } from "../src/users/index.js";
import { freshClone, mode, readmeCommands, removeAfter } from "./support/readme.js";

describe("the README's commands work for root in a private directory", () => {
  it.runIf(isRoot())(
    "root runs them from a clone under a 0700 directory with a 0700 home, and neither is opened",
    () => {
      const parent = mkdtempSync(join(tmpdir(), "crw-private-"));
      const home = mkdtempSync(join(tmpdir(), "crw-root-home-"));
      removeAfter(parent, home);
      const clone = join(parent, "crw");
      freshClone(clone, undefined);
      readmeCommands(undefined, home, clone);
      expect(mode(parent)).toBe(0o700);
      expect(mode(home)).toBe(0o700);
    },
    900_000,
  );
});
