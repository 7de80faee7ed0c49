#!/usr/bin/env node
// stdio <-> ws bridge for the fake app-server, as `codex app-server proxy` bridges to the real one:
//   node stdioProxy.mjs ws://127.0.0.1:PORT
// One JSON message per LF-terminated line on stdin/stdout; exits when either side closes.
import WebSocket from "ws";

const url = process.argv[2];
if (!url) {
  process.stderr.write("usage: stdioProxy.mjs ws://HOST:PORT\n");
  process.exit(2);
}
const socket = new WebSocket(url, { perMessageDeflate: false });
const queued = [];
let buffered = "";
socket.on("open", () => {
  for (const line of queued.splice(0)) socket.send(line);
});
socket.on("message", (data) => process.stdout.write(`${data.toString()}\n`));
socket.on("close", () => process.exit(0));
socket.on("error", (e) => {
  process.stderr.write(`proxy: ${e.message}\n`);
  process.exit(1);
});
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => {
  buffered += chunk;
  let newline = buffered.indexOf("\n");
  while (newline >= 0) {
    const line = buffered.slice(0, newline);
    buffered = buffered.slice(newline + 1);
    if (line.trim()) {
      if (socket.readyState === WebSocket.OPEN) socket.send(line);
      else queued.push(line);
    }
    newline = buffered.indexOf("\n");
  }
});
process.stdin.on("end", () => socket.close());
