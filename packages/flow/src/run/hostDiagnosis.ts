import { existsSync, statSync } from "node:fs";
import { connect } from "node:net";
import { homedir } from "node:os";
import { join } from "node:path";

/**
 * Why crw cannot reach the owner's Codex host, and what to do, from the run's host string alone. The
 * default host is `codex app-server proxy`, which pipes to the control socket the Codex CLI's managed
 * app-server listens on; an app-server started on stdio (as an IDE extension runs it) has none.
 */
export interface HostDiagnosis {
  /** The host as the run names it. */
  host: string;
  why: string;
  fix: string;
}

const LISTEN_FIX =
  "start the app-server with `codex app-server --listen ws://127.0.0.1:PORT` and start the run with `--host ws://127.0.0.1:PORT`";

/** How a run's host string reaches the app-server: the CLI's control socket (the default), a socket, ws, a command. */
export type HostKind = "control_socket" | "unix" | "ws" | "command";

export function hostKind(host: string): HostKind {
  const spec = host.trim();
  if (spec === "" || /\bapp-server proxy\b/.test(spec)) return "control_socket";
  if (/^unix:\/\//i.test(spec)) return "unix";
  if (/^wss?:\/\//i.test(spec)) return "ws";
  return "command";
}

export function controlSocketPath(env: NodeJS.ProcessEnv = process.env): string {
  const home = env.CODEX_HOME || join(homedir(), ".codex");
  return join(home, "app-server-control", "app-server-control.sock");
}

/** The diagnosis of a host crw failed to reach with `message`; it reads the file system, connects nothing. */
export function diagnoseHost(
  host: string,
  message: string,
  env: NodeJS.ProcessEnv = process.env,
): HostDiagnosis {
  const spec = host.trim();
  const kind = hostKind(spec);
  if (kind === "control_socket") {
    const socket = controlSocketPath(env);
    const isSocket = existsSync(socket) && statSync(socket).isSocket();
    return {
      host: spec || "codex app-server proxy",
      why: isSocket
        ? `the control socket ${socket} does not answer (${message}): the Codex that made it has exited`
        : `there is no control socket at ${socket}: the owner's Codex runs its app-server on stdio (as an IDE extension does), or no Codex CLI runs with this CODEX_HOME`,
      fix: `run the owner in the Codex CLI (\`codex\`, which listens on that socket), or ${LISTEN_FIX}`,
    };
  }
  if (kind === "unix") {
    const path = spec.slice("unix://".length);
    return {
      host: spec,
      why: existsSync(path)
        ? `the socket ${path} does not answer (${message})`
        : `there is no socket at ${path} (${message})`,
      fix: `check that the app-server listens on unix://${path}, or ${LISTEN_FIX}`,
    };
  }
  if (kind === "ws") {
    return {
      host: spec,
      why: /ECONNREFUSED|refused/i.test(message)
        ? `nothing listens at ${spec}: connection refused`
        : `${spec} does not answer as an app-server (${message})`,
      fix: `check the --host the run was started with against the app-server's --listen address, or ${LISTEN_FIX}`,
    };
  }
  return {
    host: spec,
    why: `the host command \`${spec}\` does not answer as an app-server (${message})`,
    fix: `check the --host command, or ${LISTEN_FIX}`,
  };
}

/**
 * Whether the host looks reachable before a run starts, without speaking its protocol: the default host's
 * control socket exists, a unix:// socket exists, a ws:// address accepts a TCP connection. A command
 * host is not judged (null): only running it would tell.
 */
export async function probeHost(
  host: string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<HostDiagnosis | null> {
  const spec = host.trim();
  const kind = hostKind(spec);
  if (kind === "control_socket") {
    const socket = controlSocketPath(env);
    return existsSync(socket)
      ? await probeConnect({ path: socket }, spec, env)
      : diagnoseHost(spec, "no socket", env);
  }
  if (kind === "unix") return probeConnect({ path: spec.slice("unix://".length) }, spec, env);
  if (kind === "ws") {
    const url = new URL(spec);
    const port = Number(url.port || (url.protocol === "wss:" ? 443 : 80));
    return probeConnect({ host: url.hostname.replace(/^\[|\]$/g, ""), port }, spec, env);
  }
  return null;
}

function probeConnect(
  to: { path: string } | { host: string; port: number },
  spec: string,
  env: NodeJS.ProcessEnv,
): Promise<HostDiagnosis | null> {
  return new Promise((resolve) => {
    const socket = connect(to as never);
    const done = (d: HostDiagnosis | null) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(d);
    };
    const timer = setTimeout(() => done(diagnoseHost(spec, "no answer within 2 s", env)), 2000);
    socket.once("connect", () => done(null));
    socket.once("error", (e) => done(diagnoseHost(spec, (e as Error).message, env)));
  });
}
