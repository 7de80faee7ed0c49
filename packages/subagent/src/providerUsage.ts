import type { PiModules } from "@crw/brain";
import { providerUsageSchema as journalUsageSchema } from "@crw/db";
import { z } from "zod";
import { currentDispatchedTurn } from "./rpcTurn.js";

/**
 * One provider response's usage, as the runner reports it to the daemon (`providerUsage` frame): the
 * journal's usage shape, with `cost` always present (0 when the model has no prices).
 */
export const providerUsageSchema = journalUsageSchema.extend({ cost: z.number().min(0) }).strict();
export type ProviderUsage = z.infer<typeof providerUsageSchema>;

export type ProviderUsageReport = (usage: ProviderUsage, turn: { turnId: string; sessionId: string }) => void;

type Ai = PiModules["ai"];
type StreamFn = (...args: never[]) => { result(): Promise<unknown> };

const tapped = new WeakSet<object>();

const whole = (n: unknown) => (typeof n === "number" && Number.isFinite(n) && n > 0 ? Math.round(n) : 0);

/**
 * Reports the usage of every provider response of this process's agent loops: each registered provider API's
 * stream functions are wrapped once, and the final message of each stream (its `usage`) is reported with the
 * dispatched turn the request was made under. Requests outside a dispatched turn report nothing. The stream
 * itself is handed to the agent loop unchanged. The offline scripted provider does not go through the
 * registry and reports no usage.
 */
export function installProviderUsageTap(ai: Ai, report: ProviderUsageReport): void {
  if (tapped.has(ai)) return;
  tapped.add(ai);
  for (const provider of ai.getApiProviders()) {
    const wrap = <F extends StreamFn>(stream: F): F =>
      ((...args: Parameters<F>) => {
        const turn = currentDispatchedTurn();
        const s = stream(...args);
        if (turn) {
          s.result().then(
            (message) => {
              const m = message as {
                api?: string;
                provider?: string;
                model?: string;
                stopReason?: string;
                usage?: Record<string, unknown> & { cost?: { total?: unknown } };
              };
              if (!m?.usage) return;
              try {
                report(
                  providerUsageSchema.parse({
                    api: m.api || provider.api,
                    provider: m.provider || "unknown",
                    model: m.model || "unknown",
                    stopReason: m.stopReason || "unknown",
                    input: whole(m.usage.input),
                    output: whole(m.usage.output),
                    cacheRead: whole(m.usage.cacheRead),
                    cacheWrite: whole(m.usage.cacheWrite),
                    totalTokens: whole(m.usage.totalTokens),
                    cost: Math.max(0, Number(m.usage.cost?.total ?? 0) || 0),
                  }),
                  { turnId: turn.turnId, sessionId: turn.sessionId },
                );
              } catch {
                // A figure that does not validate is not reported; the turn itself is unaffected.
              }
            },
            () => {},
          );
        }
        return s;
      }) as F;
    ai.registerApiProvider(
      {
        api: provider.api,
        stream: wrap(provider.stream as unknown as StreamFn) as unknown as typeof provider.stream,
        streamSimple: wrap(
          provider.streamSimple as unknown as StreamFn,
        ) as unknown as typeof provider.streamSimple,
      },
      "crw-provider-usage",
    );
  }
}
