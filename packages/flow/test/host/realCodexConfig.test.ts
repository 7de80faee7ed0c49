import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { MockModel, type RealCodex, startRealCodex } from "@crw/tools/codex";
import { afterAll, expect, it } from "vitest";
import { createAppServerHost } from "../../src/index.js";

/**
 * An invalid config.toml does not stop the real app-server: it uses defaults (the real provider) and says
 * so with a configWarning notification. The harness's client treats it as fatal, and the adapter reports
 * it as a typed event.
 */

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});

it("a configWarning from the real app-server fails the harness's client and is a typed event of the adapter", async () => {
  const root = mkdtempSync(join(tmpdir(), "crw-real-codex-config-"));
  const model = await MockModel.start();
  cleanups.push(async () => {
    await model.stop();
    rmSync(root, { recursive: true, force: true });
  });
  // A key given twice: not TOML.
  let codex: RealCodex | null = null;
  try {
    codex = await startRealCodex({
      home: join(root, "home"),
      cwd: root,
      baseUrl: model.baseUrl,
      extraToml: 'model = "again"\n',
    });
  } catch (e) {
    // The warning may already have failed the handshake's client.
    expect((e as Error).message).toMatch(/configWarning/);
    return;
  }
  const running = codex;
  cleanups.push(() => running.stop());
  const warnings: string[] = [];
  const host = createAppServerHost({
    transport: running.url,
    onEvent: (e) => {
      if (e.type === "config_warning") warnings.push(e.summary);
    },
  });
  cleanups.push(() => host.close());
  await host.request("thread/loaded/list", {});
  await expect.poll(() => warnings.length, { timeout: 10_000 }).toBeGreaterThan(0);
  await expect(running.client.request("thread/loaded/list", {})).rejects.toThrow(/configWarning/);
});
