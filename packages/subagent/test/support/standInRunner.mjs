// A stand-in runner that speaks just enough of the protocol to put host calls on the channel exactly as
// given, with none of the real runner's own checks in between: hello (build CRW_STANDIN_BUILD), boot, then
// for each turn every host call of its `script` ({ method, params }), one after the other. The turn's text
// is the JSON list of the daemon's answers, so a test reads what the daemon replied to each call. It
// answers every release with an error, as a runner that could not release a session would. With
// CRW_STANDIN_FORKS it appends a line to that file when it starts; with CRW_STANDIN_EXIT it exits at once,
// before hello (as a runner that cannot start). With CRW_STANDIN_CANCEL_MS it cancels each host call
// (hostRpcCancel naming it) that long after sending it, and still waits for the daemon's answer.
import { appendFileSync } from "node:fs";

if (process.env.CRW_STANDIN_FORKS) appendFileSync(process.env.CRW_STANDIN_FORKS, `${process.pid}\n`);
if (process.env.CRW_STANDIN_EXIT) process.exit(3);
const send = (frame) => process.send(frame);
const waiting = new Map();
process.on("message", (frame) => {
  if (frame.type === "boot") {
    send({
      type: "bootReply",
      requestId: frame.requestId,
      result: { ok: { buildId: process.env.CRW_STANDIN_BUILD, policyRevision: frame.retryPolicy.revision } },
    });
  } else if (frame.type === "hostRpcReply") {
    waiting.get(frame.requestId)?.(frame.result);
  } else if (frame.type === "turn") {
    void runTurn(frame);
  } else if (frame.type === "release") {
    // CRW_STANDIN_RELEASE_MS: how long the answer takes.
    setTimeout(
      () =>
        send({
          type: "releaseReply",
          requestId: frame.requestId,
          result: { error: { name: "Error", code: "release_failed", message: "could not release" } },
        }),
      Number(process.env.CRW_STANDIN_RELEASE_MS ?? 0),
    );
  } else if (frame.type === "shutdown") {
    process.exit(0);
  }
});
async function runTurn({ requestId, turn }) {
  const answers = [];
  for (const [i, step] of (turn.script ?? []).entries()) {
    const rpcId = `${turn.turnId}-${i}`;
    const answered = new Promise((resolve) => waiting.set(rpcId, resolve));
    send({
      type: "hostRpc",
      requestId: rpcId,
      turnId: turn.turnId,
      method: step.method,
      params: step.params,
    });
    if (process.env.CRW_STANDIN_CANCEL_MS) {
      setTimeout(
        () => send({ type: "hostRpcCancel", requestId: `${rpcId}-cancel`, rpcId }),
        Number(process.env.CRW_STANDIN_CANCEL_MS),
      );
    }
    answers.push(await answered);
  }
  send({
    type: "turnReply",
    requestId,
    result: {
      ok: {
        turnId: turn.turnId,
        sessionId: turn.sessionId,
        text: JSON.stringify(answers),
        stopReason: "end",
      },
    },
  });
}
process.on("disconnect", () => process.exit(0));
send({ type: "hello", requestId: "hello", buildId: process.env.CRW_STANDIN_BUILD, pid: process.pid });
