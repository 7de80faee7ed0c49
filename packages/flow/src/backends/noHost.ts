import type { SessionHost } from "../host/sessionHost.js";
import { FlowError } from "../util/errors.js";

/**
 * The host of a run that has no session host (the local backend): nothing of the run may ask it, so any
 * use is a programming error named as such, never an answer made up for the caller.
 */
export function noSessionHost(backend: string): SessionHost {
  const refuse = (what: string): never => {
    throw new FlowError("host", `the ${backend} backend has no session host (${what} was asked)`, 1);
  };
  return {
    readThread: async () => refuse("thread/read"),
    listSubagents: async () => refuse("thread/list"),
    readTokenCount: async () => refuse("the token count"),
    interruptTurn: async () => refuse("turn/interrupt"),
    startTurn: async () => refuse("turn/start"),
    close: async () => {},
  };
}
