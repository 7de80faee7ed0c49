import { createAppServerHost } from "../host/appServerHost.js";
import { hostTransportFromSpec } from "../host/transport/fromSpec.js";
import { type HookListEntry, shellWord } from "./install.js";

/**
 * hooks/list of a fresh `codex app-server` (stdio) run with the given CODEX_HOME, for `crw flow hook
 * install`. `codex` is the binary (default: `codex` on PATH).
 */
export async function listHooks(options: {
  codexHome: string;
  cwd: string;
  codex?: string;
}): Promise<HookListEntry[]> {
  const transport = hostTransportFromSpec(`${shellWord(options.codex ?? "codex")} app-server`, {
    ...process.env,
    CODEX_HOME: options.codexHome,
  });
  const host = createAppServerHost({ transport, requestTimeoutMs: 20_000, connectTimeoutMs: 20_000 });
  try {
    const result = await host.request("hooks/list", { cwds: [options.cwd] });
    if (!result.ok) throw new Error(`hooks/list failed: ${result.reason}: ${result.message}`);
    const data = (result.value as { data?: Array<{ hooks?: HookListEntry[] }> }).data ?? [];
    return data.flatMap((entry) => entry.hooks ?? []);
  } finally {
    await host.close();
  }
}
