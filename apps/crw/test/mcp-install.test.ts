import { execFile } from "node:child_process";
import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  realpathSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { CRW_BIN } from "./support/mcpClient.js";

/**
 * `crw mcp install codex|claude` writes the client's configuration: crw's own entry with absolute paths (a
 * client starts servers with a PATH of its own), everything else in the file kept as it was.
 */
const run = promisify(execFile);
const root = mkdtempSync(join(tmpdir(), "crw-mcp-install-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

async function install(args: string[], home: string, extra: Record<string, string> = {}) {
  const env: NodeJS.ProcessEnv = { ...process.env, HOME: home, ...extra };
  delete env.CODEX_HOME;
  delete env.CRW_DAEMON_DIR;
  delete env.CRW_HOME;
  if (extra.CODEX_HOME) env.CODEX_HOME = extra.CODEX_HOME;
  try {
    const { stdout, stderr } = await run(process.execPath, [CRW_BIN, "mcp", "install", ...args], {
      env,
      cwd: home,
    });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const x = e as { code: number; stdout: string; stderr: string };
    return { code: x.code, stdout: x.stdout, stderr: x.stderr };
  }
}

function home(name: string): string {
  const dir = join(root, name);
  mkdirSync(dir, { recursive: true });
  return dir;
}

const cli = realpathSync(CRW_BIN);

describe("crw mcp install", () => {
  it("codex: replaces crw's table in config.toml and keeps every other line as it was", async () => {
    const h = home("codex");
    const codexHome = join(h, "codex-home");
    mkdirSync(codexHome);
    const kept = ['model = "gpt-5"', "", "[mcp_servers.other]", 'command = "other"', ""].join("\n");
    const old = ["[mcp_servers.crw]", 'command = "crw"', "", "[mcp_servers.crw.env]", 'OLD = "1"', ""].join(
      "\n",
    );
    const tail = ["[profiles.fast]", 'model = "small"', ""].join("\n");
    writeFileSync(join(codexHome, "config.toml"), `${kept}\n${old}\n${tail}`);
    const r = await install(
      ["codex", "--data-dir", join(h, "data"), "--session", "mine", "--token", "t0k"],
      h,
      {
        CODEX_HOME: codexHome,
      },
    );
    expect(r.code, r.stderr).toBe(0);
    const toml = readFileSync(join(codexHome, "config.toml"), "utf8");
    expect(toml.startsWith(kept)).toBe(true);
    expect(toml).toContain(tail);
    expect(toml).not.toContain('OLD = "1"');
    expect(toml.match(/\[mcp_servers\.crw\]/g)).toHaveLength(1);
    expect(toml).toContain(`command = ${JSON.stringify(process.execPath)}`);
    expect(toml).toContain(
      `args = [${[cli, "mcp", "--data-dir", join(h, "data"), "--session", "mine"].map((a) => JSON.stringify(a)).join(", ")}]`,
    );
    expect(toml).toContain("required = true");
    // Codex passes a server only HOME, PATH and a few others: crw's variables are named to be copied
    expect(toml).toMatch(/env_vars = \[.*"CRW_DAEMON_DIR".*"DATABASE_URL".*"CRW_MODEL".*\]/);
    expect(toml).toMatch(/\[mcp_servers\.crw\.env\]\nCRW_TOKEN = "t0k"/);
    // a second install changes nothing more
    await install(["codex", "--data-dir", join(h, "data"), "--session", "mine", "--token", "t0k"], h, {
      CODEX_HOME: codexHome,
    });
    expect(readFileSync(join(codexHome, "config.toml"), "utf8")).toBe(toml);
  });

  it("codex: with no CODEX_HOME, writes ~/.codex/config.toml, made private as it may hold a token", async () => {
    const h = home("codex-default");
    const r = await install(["codex"], h);
    expect(r.code, r.stderr).toBe(0);
    const file = join(h, ".codex", "config.toml");
    expect(readFileSync(file, "utf8")).toMatch(/^\[mcp_servers\.crw\]\n/);
    expect(statSync(file).mode & 0o777).toBe(0o600);
  });

  it("claude: adds crw to ~/.claude.json's mcpServers, keeping the rest and the file's mode", async () => {
    const h = home("claude");
    const file = join(h, ".claude.json");
    const before = {
      numStartups: 3,
      mcpServers: { other: { command: "other", args: [] } },
      projects: { "/x": {} },
    };
    writeFileSync(file, JSON.stringify(before));
    chmodSync(file, 0o640);
    const r = await install(["claude", "--data-dir", join(h, "data")], h);
    expect(r.code, r.stderr).toBe(0);
    const after = JSON.parse(readFileSync(file, "utf8"));
    expect(after).toMatchObject({
      numStartups: 3,
      projects: { "/x": {} },
      mcpServers: { other: before.mcpServers.other },
    });
    expect(after.mcpServers.crw).toEqual({
      type: "stdio",
      command: process.execPath,
      args: [cli, "mcp", "--data-dir", join(h, "data")],
      env: {},
      timeout: 3_600_000,
    });
    expect(statSync(file).mode & 0o777).toBe(0o640);
  });

  it("a config file others can read is made private when a token is written into it", async () => {
    const h = home("claude-token");
    const file = join(h, ".claude.json");
    writeFileSync(file, "{}");
    chmodSync(file, 0o644);
    const r = await install(["claude", "--token", "s3cret"], h);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toContain("now holds a token: its mode goes from 644 to 600");
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(JSON.parse(readFileSync(file, "utf8")).mcpServers.crw.env).toEqual({ CRW_TOKEN: "s3cret" });
  });

  it("claude --project: writes .mcp.json in the current directory", async () => {
    const h = home("claude-project");
    const r = await install(["claude", "--project"], h);
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(readFileSync(join(h, ".mcp.json"), "utf8")).mcpServers.crw.command).toBe(
      process.execPath,
    );
  });

  it("refuses a config that is not JSON without touching it, and an unknown client as an input error", async () => {
    const h = home("claude-bad");
    const file = join(h, ".claude.json");
    writeFileSync(file, "{ not json");
    const r = await install(["claude"], h);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(".claude.json is not JSON");
    expect(readFileSync(file, "utf8")).toBe("{ not json");
    const bad = await install(["cursor"], h);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("install needs codex or claude");
  });
});
