import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";

const agentDir = join(import.meta.dirname, "../../src/agent");

describe("pi-agent-core and pi-ai stay out of every fast path", () => {
  it("no agent module imports them at load time; only loadPi imports them, dynamically", () => {
    const offenders: string[] = [];
    for (const file of readdirSync(agentDir).filter((f) => f.endsWith(".ts"))) {
      const source = readFileSync(join(agentDir, file), "utf8");
      // Every static import or re-export statement, however it is wrapped over lines.
      for (const match of source.matchAll(/^(?:import|export)\s[^;]*?from\s+"(@mariozechner\/[^"]+)"/gms)) {
        if (!/^(?:import|export)\s+type\b/.test(match[0]))
          offenders.push(`${file}: ${match[0].split("\n")[0]}`);
      }
      for (const match of source.matchAll(/import\(\s*"(@mariozechner\/[^"]+)"\s*\)/g)) {
        if (file !== "providers.ts") offenders.push(`${file}: dynamic ${match[1]} outside loadPi`);
      }
    }
    expect(offenders).toEqual([]);
  });

  it("loadPi loads both on first use and serves every later turn from the same modules", async () => {
    const before = performance.now();
    const agent = await import("../../src/agent/index.js");
    expect(typeof agent.runChildTurn).toBe("function");
    const pi = await agent.loadPi();
    expect(typeof pi.core.Agent).toBe("function");
    expect(typeof pi.ai.streamSimple).toBe("function");
    // The same promise serves every later turn.
    expect(await agent.loadPi()).toBe(pi);
    expect(performance.now()).toBeGreaterThan(before);
  });
});
