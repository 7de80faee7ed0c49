import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ensureTestUser, isRoot } from "../src/users/index.js";
import { freshClone, mode, readmeCommands, removeAfter } from "./support/readme.js";

describe("the README's commands work for any user", () => {
  it("an ordinary user runs them from a clone in its 0700 home, the daemon's default data directory included", () => {
    const user = isRoot() ? ensureTestUser("crw-test-user") : undefined;
    const home = user?.home ?? mkdtempSync(join(tmpdir(), "crw-home-"));
    const clone = join(home, `crw-${process.pid}`);
    removeAfter(clone, join(home, ".crw"));
    if (!user) removeAfter(home);
    freshClone(clone, user);
    readmeCommands(user, home, clone);
    expect(mode(home)).toBe(0o700);
  }, 900_000);
});
