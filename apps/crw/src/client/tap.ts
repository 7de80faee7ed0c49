import { CONNECTION_HELP, inputError, out, parse, parseOrExit, withFollow } from "./common.js";
import { formatMessage } from "./session.js";

const HELP = `Usage: crw tap SESSION [--until-idle] [options]

Follows a session live (typically a delegated child): its journal as it commits, and live progress while
this daemon runs its turns. Read-only: it never starts or borrows a turn. Stops with Ctrl+C, or with
--until-idle once the session has no open call and ends with an answer.

${CONNECTION_HELP}`;

const PREFIX = "crw tap";

export async function runTapCli(args: string[]): Promise<number> {
  const parsed = parseOrExit(PREFIX, () => parse(args, { "until-idle": { type: "boolean" } }));
  if (typeof parsed === "number") return parsed;
  const { values, positionals } = parsed;
  if (values.help) {
    out(HELP);
    return 0;
  }
  const [sessionId, extra] = positionals;
  if (!sessionId) return inputError(PREFIX, "tap needs SESSION; see 'crw tap --help'");
  if (extra) return inputError(PREFIX, `unexpected '${extra}'; see 'crw tap --help'`);
  const json = values.json === true;
  // after a reconnect the tap goes on after the last journal row it showed: none is shown twice
  let lastSeq = 0;
  return withFollow(PREFIX, values, async (client) => {
    client.onNotification((method, params) => {
      if (method !== "session.tap") return;
      const seq = (params.message as { seq?: unknown } | undefined)?.seq;
      if (typeof seq === "number") {
        if (seq <= lastSeq) return;
        lastSeq = seq;
      }
      if (json) out(JSON.stringify(params));
      else if (params.message) out(formatMessage(params.message as Parameters<typeof formatMessage>[0]));
      else if (params.live) {
        const live = params.live as { type: string; event?: { type: string; toolName?: string } };
        if (live.type === "progress" && live.event?.type === "tool")
          out(`      … tool ${live.event.toolName}`);
      }
    });
    const stop = new Promise<{ lastSeq: number; idle: boolean }>((resolve) =>
      process.once("SIGINT", () => resolve({ lastSeq: -1, idle: false })),
    );
    const r = await Promise.race([
      client.call<{ lastSeq: number; idle: boolean }>("session.tap", {
        sessionId,
        ...(lastSeq > 0 ? { afterSeq: lastSeq } : {}),
        ...(values["until-idle"] ? { untilIdle: true } : {}),
      }),
      stop,
    ]);
    if (json) out(JSON.stringify({ ok: true, ...r }));
    return 0;
  });
}
