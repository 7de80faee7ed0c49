import { execFileSync } from "node:child_process";
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  buildPacket,
  dirFrom,
  markerInText,
  overlayForPacket,
  repositoryTools,
  sendInputMessage,
  spawnMessage,
  unusable,
} from "@crw/flow";
import { describe, expect, it } from "vitest";
import { builtFlow, ensureBuilt } from "./helpers/cli.js";

const base = {
  marker: "review.1/t1-a1",
  role: "reviewer" as const,
  workspace: "/ws/review.1",
  overlay: "Review well.\n\n## Native spawn\nspawn helpers like this\n\n## Style\nBe short.",
  tmpdir: null,
  goRoot: null,
  earlierAttempts: [],
  task: "Judge the change.",
  repair: null,
  schema: { type: "object", required: ["ok"] },
};

describe("the spawn message and the packet", () => {
  describe("the spawn message", () => {
    const m = spawnMessage("review.1/t1-a1", "reviewer", "/ws/review.1", "/s/packet-t1-a1.md");
    const lines = m.split("\n");

    it("is short: the marker line, the role line, a blank line, and no task text of its own (S000-035)", () => {
      expect(lines.slice(0, 3)).toEqual(["crw-flow-op: review.1/t1-a1", "CRW-ROLE: reviewer", ""]);
      expect(markerInText(m)).toBe("review.1/t1-a1");
      // the packet holds the rest: three sentences of rules and the packet's path, nothing else
      expect(lines.slice(3).filter((l) => l !== "")).toHaveLength(3);
      expect(m).not.toContain("## ");
    });

    it("says the shell does not start in the workspace, names it, requires workdir there and absolute paths under it (S000-036)", () => {
      expect(lines[3]).toBe(
        "Your shell starts in a directory that is NOT your workspace. Your workspace is /ws/review.1: run every command with workdir /ws/review.1 and edit only by absolute paths under /ws/review.1.",
      );
    });

    it("says to read the packet in full and follow it, and that the subagent is a leaf that never spawns (S000-037)", () => {
      expect(lines[4]).toBe(
        "Read the task packet /s/packet-t1-a1.md in full and follow it exactly. You are a leaf subagent: never spawn agents.",
      );
    });

    it("says the final message is exactly the packet's JSON object and nothing else (S000-038)", () => {
      expect(lines[5]).toBe(
        "Your final message is exactly the JSON object the packet names, and nothing else.",
      );
      expect(lines.slice(6)).toEqual([""]);
    });
  });

  it("a send_input message is the marker line and the turn's input (S000-039)", () => {
    expect(sendInputMessage("review.1/t2-a1", "fix it")).toBe("crw-flow-op: review.1/t2-a1\nfix it");
  });

  it("the packet is self-contained: workspace rules, no git writes, task, output contract with the schema (S000-040 S000-050)", () => {
    const p = buildPacket({ ...base, earlierAttempts: ["The previous attempt (1) was cut off."] });
    expect(p).toContain("Work only under this absolute path");
    expect(p).toContain("writes nothing: change nothing anywhere");
    expect(p).toContain("Nobody runs git commit, git add, git branch, git reset or git checkout.");
    const order = [
      "## Where you work",
      "## Role: reviewer",
      "## Earlier attempts",
      "## Task",
      "## Output contract",
    ].map((h) => p.indexOf(h));
    expect(order.every((i, n) => i >= 0 && (n === 0 || i > (order[n - 1] as number)))).toBe(true);
    expect(p).toContain('"required": [\n    "ok"\n  ]');
  });

  it("the role's overlay goes in without its native-spawn section (S000-049)", () => {
    expect(overlayForPacket(base.overlay)).toBe("Review well.\n\n## Style\nBe short.");
    expect(buildPacket(base)).not.toContain("spawn helpers");
  });

  describe("the repository tools of a run with a recorded TMPDIR and a go root", () => {
    const tools = repositoryTools(
      { dir: "/tmp/run", specPath: "/s/run.json" },
      { dir: "/opt/go", source: "/repo/.crw/flow-roles.json" },
    );
    const packet = buildPacket({
      ...base,
      tmpdir: { dir: "/tmp/run", specPath: "/s/run.json" },
      goRoot: { dir: "/opt/go", source: "/repo/.crw/flow-roles.json" },
    });
    const section = packet.slice(packet.indexOf("## Repository tools"), packet.indexOf("## Role:"));

    it("the packet has a Repository tools section naming go under go_root and the file that sets it (S000-041)", () => {
      expect(packet.indexOf("## Repository tools")).toBeGreaterThan(packet.indexOf("## Where you work"));
      expect(section).toContain(
        "- The repository's go is /opt/go/bin/go (verifier.go_root, set in /repo/.crw/flow-roles.json).",
      );
    });

    it("the section's prefix sets PATH, GOROOT and GOTOOLCHAIN=local for go, for every command (S000-042)", () => {
      expect(tools?.prefix.endsWith('PATH=/opt/go/bin:"$PATH" GOROOT=/opt/go GOTOOLCHAIN=local')).toBe(true);
      expect(section).toContain(
        'Put this prefix in front of every command you run (your shell is not configured for this run):\n\n```\nTMPDIR=/tmp/run PATH=/opt/go/bin:"$PATH" GOROOT=/opt/go GOTOOLCHAIN=local\n```',
      );
    });

    it("the recorded TMPDIR is the first tool: a fact naming the directory and run.json, before go's (S000-043)", () => {
      expect(tools?.facts[0]).toBe(
        "The run's temporary directory is /tmp/run (env.TMPDIR of /s/run.json); temporary files go there.",
      );
      expect(tools?.facts[1]).toContain("/opt/go/bin/go");
      expect(section.indexOf("/tmp/run (env.TMPDIR")).toBeLessThan(section.indexOf("The repository's go"));
    });

    it("TMPDIR=<dir> comes first in the prefix the subagent puts before every command (S000-044)", () => {
      expect(tools?.prefix.split(" ")[0]).toBe("TMPDIR=/tmp/run");
      expect(section).toMatch(/every command you run[^\n]*\n\n```\nTMPDIR=\/tmp\/run /);
    });

    it("TMPDIR=<dir> comes first in the environment entries (S000-045)", () => {
      expect(tools?.entries.map(([k]) => k)).toEqual(["TMPDIR", "PATH", "GOROOT", "GOTOOLCHAIN"]);
      expect(tools?.entries[0]).toEqual(["TMPDIR", "/tmp/run"]);
      const entries = section.slice(section.indexOf("Environment entries, in order:"));
      expect(entries.split("\n").filter((l) => l.startsWith("- "))[0]).toBe("- TMPDIR=/tmp/run");
    });
  });

  it("no go gives the TMPDIR tool alone (S000-046)", () => {
    expect(repositoryTools({ dir: "/tmp/run", specPath: "/s/run.json" }, null)).toEqual({
      prefix: "TMPDIR=/tmp/run",
      entries: [["TMPDIR", "/tmp/run"]],
      facts: [
        "The run's temporary directory is /tmp/run (env.TMPDIR of /s/run.json); temporary files go there.",
      ],
    });
  });

  it("a spec without env gives the tools section as before: no TMPDIR fact, prefix or entry (S000-047)", () => {
    const go = { dir: "/opt/go", source: "/r" };
    expect(repositoryTools(null, go)).toEqual({
      prefix: 'PATH=/opt/go/bin:"$PATH" GOROOT=/opt/go GOTOOLCHAIN=local',
      entries: [
        ["PATH", "/opt/go/bin:$PATH"],
        ["GOROOT", "/opt/go"],
        ["GOTOOLCHAIN", "local"],
      ],
      facts: ["The repository's go is /opt/go/bin/go (verifier.go_root, set in /r)."],
    });
    const packet = buildPacket({ ...base, goRoot: go });
    expect(packet).toContain("## Repository tools");
    expect(packet).not.toContain("TMPDIR");
    expect(repositoryTools(null, null)).toBeNull();
    expect(buildPacket(base)).not.toContain("Repository tools");
  });

  it("a repair packet names the task once, the answer repaired and the repair instruction (S000-151)", () => {
    const p = buildPacket({
      ...base,
      repair: { answer: "not json", errors: ["the answer holds no valid JSON object"] },
    });
    expect(p.split("Judge the change.").length).toBe(2);
    expect(p).toContain("not json");
    expect(p).toContain("Answer again");
  });
});

describe("tmploc", () => {
  it("answers TMPDIR as written, or the platform default; says why a directory cannot be used (S000-184 S000-187)", () => {
    const d = mkdtempSync(join(tmpdir(), "crw-tmploc-"));
    try {
      expect(dirFrom({ TMPDIR: d })).toEqual({ ok: true, dir: d, defaulted: false });
      expect(dirFrom({})).toMatchObject({ ok: true, defaulted: true });
      expect(dirFrom({ TMPDIR: "rel/dir" })).toMatchObject({
        ok: false,
        reason: expect.stringContaining("not an absolute"),
      });
      expect(dirFrom({ TMPDIR: join(d, "missing") })).toMatchObject({
        ok: false,
        reason: expect.stringContaining("does not exist"),
      });
      writeFileSync(join(d, "f"), "");
      expect(unusable(join(d, "f"))).toContain("not a directory");
      if (process.getuid?.() !== 0) {
        chmodSync(d, 0o500);
        expect(unusable(d)).toContain("not writable");
        chmodSync(d, 0o700);
      } else {
        // root writes through any mode bits: here the directory is made read-only by a read-only mount of
        // it (bubblewrap), and the built check runs under that mount
        ensureBuilt();
        const check = `import { unusable } from ${JSON.stringify(builtFlow)};
          process.stdout.write(String(unusable(${JSON.stringify(d)})));`;
        const out = execFileSync(
          "bwrap",
          [
            "--bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--ro-bind",
            d,
            d,
            process.execPath,
            "--input-type=module",
            "-e",
            check,
          ],
          { encoding: "utf8" },
        );
        expect(out).toBe(`TMPDIR '${d}' is not writable`);
        expect(unusable(d)).toBeNull();
      }
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });
});
