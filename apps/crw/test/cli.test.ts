import { execFile, spawn } from "node:child_process";
import { resolve } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";

const run = promisify(execFile);
const bin = resolve(import.meta.dirname, "../bin/crw.mjs");

async function crw(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [bin, ...args]);
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}

describe("the built crw CLI", () => {
  it("--help lists the command groups and exits 0", async () => {
    const r = await crw("--help");
    expect(r.code).toBe(0);
    for (const group of ["flow", "daemon", "workflow", "session", "tap", "account", "token"])
      expect(r.stdout).toContain(`  ${group} `);
  });

  it("--version prints the package version", async () => {
    const r = await crw("--version");
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^crw \d+\.\d+\.\d+\n$/);
  });

  it("a reader that stops early (crw … | head) ends the command quietly, exit 0, no stack trace", async () => {
    const child = spawn(process.execPath, [bin, "--help"], { stdio: ["ignore", "pipe", "pipe"] });
    // the pipe is closed before the command writes anything: its first write meets EPIPE
    child.stdout.destroy();
    let stderr = "";
    child.stderr.on("data", (d) => {
      stderr += d.toString();
    });
    const code = await new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
    expect(stderr).not.toMatch(/EPIPE|Unhandled/);
    expect(code).toBe(0);
  });

  it("an unknown group is an input error (exit 2) that says what to do", async () => {
    const r = await crw("frobnicate");
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("crw --help");
  });
});
