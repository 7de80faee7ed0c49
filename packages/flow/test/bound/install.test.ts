import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { type HookListEntry, hookBlock, installHook, withTrustedHash } from "../../src/bound/index.js";

let home: string;
beforeEach(() => {
  home = mkdtempSync(join(tmpdir(), "crw-install-"));
});
afterEach(() => rmSync(home, { recursive: true, force: true }));

const listed = (command: string, trustStatus: string, hash = "sha256:aa"): HookListEntry[] => [
  {
    key: `${home}/config.toml:pre_tool_use:0:0`,
    eventName: "preToolUse",
    handlerType: "command",
    command,
    currentHash: hash,
    trustStatus,
    matcher: "spawn_agent",
  },
];

describe("crw flow hook install", () => {
  it("appends the hook block once and the trust table by hooks/list's key and hash", async () => {
    writeFileSync(join(home, "config.toml"), 'model = "m"\n');
    const command = "/usr/bin/node /x/crw.mjs flow hook pre-tool-use";
    const first = await installHook({
      codexHome: home,
      command,
      listHooks: async () => listed(command, "untrusted"),
    });
    expect(first).toMatchObject({ added: true, trusted: true, restartNeeded: true, hash: "sha256:aa" });
    const text = readFileSync(join(home, "config.toml"), "utf8");
    expect(text).toBe(
      `model = "m"\n${hookBlock(command)}\n[hooks.state."${home}/config.toml:pre_tool_use:0:0"]\ntrusted_hash = "sha256:aa"\n`,
    );
    const again = await installHook({
      codexHome: home,
      command,
      listHooks: async () => listed(command, "trusted"),
    });
    expect(again).toMatchObject({ added: false, trusted: false, restartNeeded: false });
    expect(readFileSync(join(home, "config.toml"), "utf8")).toBe(text);
  });

  it("a changed hook (a new hash) is trusted in place: one table, never a duplicate", () => {
    const key = "/h/config.toml:pre_tool_use:0:0";
    const once = withTrustedHash('model = "m"\n', key, "sha256:old");
    const twice = withTrustedHash(`${once}\n[other]\nx = 1\n`, key, "sha256:new");
    expect(twice.match(/\[hooks\.state\./g)).toHaveLength(1);
    expect(twice).toContain('trusted_hash = "sha256:new"');
    expect(twice).not.toContain("sha256:old");
    expect(twice).toContain("[other]\nx = 1");
  });

  it("refuses a CODEX_HOME that does not exist, and a hook hooks/list does not show", async () => {
    await expect(
      installHook({ codexHome: join(home, "nope"), command: "c", listHooks: async () => [] }),
    ).rejects.toMatchObject({ name: "BoundError", message: expect.stringMatching(/does not exist/) });
    await expect(
      installHook({ codexHome: home, command: "c", listHooks: async () => [] }),
    ).rejects.toMatchObject({
      message: expect.stringMatching(/does not list the hook/),
    });
  });
});
