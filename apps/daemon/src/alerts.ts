import { open, readFile, rename } from "node:fs/promises";
import { join } from "node:path";
import { z } from "zod";

/** One administrator alert: a condition with a stable key (raising it again updates it, never duplicates). */
export interface Alert {
  readonly key: string;
  readonly severity: "info" | "warning" | "error";
  readonly audience: "administrators";
  readonly text: Readonly<Record<string, string>>;
  readonly raisedAt: string;
  /** How many times the condition was raised since it was last cleared. */
  readonly count: number;
}

const alertSchema = z.strictObject({
  key: z.string().min(1).max(200),
  severity: z.enum(["info", "warning", "error"]),
  audience: z.literal("administrators"),
  text: z.record(z.string(), z.string()),
  raisedAt: z.string(),
  count: z.number().int().min(1),
});
const fileSchema = z.strictObject({ version: z.literal(1), alerts: z.array(alertSchema) });

export const alertsPath = (dataDir: string) => join(dataDir, "alerts.json");

/**
 * The daemon's AlertService: current administrator alerts, durable in `<dataDir>/alerts.json` (written to a
 * temporary file, fsynced, renamed), so an alert raised just before a crash is still shown after it. Writes
 * are serialized; a failed write rejects its caller (who logs it) and leaves the previous file intact.
 */
export class AlertService {
  #alerts = new Map<string, Alert>();
  #writing: Promise<void> = Promise.resolve();

  private constructor(private readonly dataDir: string) {}

  static async open(dataDir: string): Promise<AlertService> {
    const service = new AlertService(dataDir);
    const text = await readFile(alertsPath(dataDir), "utf8").catch((e: NodeJS.ErrnoException) => {
      if (e.code === "ENOENT") return undefined;
      throw e;
    });
    if (text !== undefined) {
      const parsed = fileSchema.safeParse(JSON.parse(text));
      // A file this daemon cannot read is replaced by the next write rather than refusing to start.
      if (parsed.success) for (const a of parsed.data.alerts) service.#alerts.set(a.key, a);
    }
    return service;
  }

  list(): Alert[] {
    return [...this.#alerts.values()];
  }

  raise(alert: Omit<Alert, "raisedAt" | "count">): Promise<void> {
    const prior = this.#alerts.get(alert.key);
    this.#alerts.set(alert.key, {
      key: alert.key,
      severity: alert.severity,
      audience: alert.audience,
      text: { ...alert.text },
      raisedAt: new Date().toISOString(),
      count: (prior?.count ?? 0) + 1,
    });
    return this.#persist();
  }

  clear(key: string): Promise<void> {
    if (!this.#alerts.delete(key)) return this.#writing;
    return this.#persist();
  }

  #persist(): Promise<void> {
    const doc = `${JSON.stringify({ version: 1, alerts: this.list() }, null, 2)}\n`;
    const write = async () => {
      const path = alertsPath(this.dataDir);
      const tmp = `${path}.${process.pid}.tmp`;
      const fh = await open(tmp, "w", 0o600);
      try {
        await fh.writeFile(doc);
        await fh.sync();
      } finally {
        await fh.close();
      }
      await rename(tmp, path);
    };
    this.#writing = this.#writing.then(write, write);
    return this.#writing;
  }
}
