#!/usr/bin/env node
// `npm run demo`: the end-to-end slice that works today, through the built CLI exactly as a user runs it:
// start the daemon on its own embedded PostgreSQL, ask its health, speak JSON-RPC to it with the owner
// token it made, and stop it.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import WebSocket from "ws";

const crw = resolve(import.meta.dirname, "../../apps/crw/bin/crw.mjs");
const dataDir = mkdtempSync(join(tmpdir(), "crw-demo-"));
const env = { ...process.env };
delete env.DATABASE_URL;
const run = (...args) => {
  process.stdout.write(`\n$ crw ${args.join(" ")}\n`);
  const out = execFileSync(process.execPath, [crw, ...args], { env, encoding: "utf8" });
  process.stdout.write(out);
  return out;
};

try {
  run("--version");
  run("daemon", "start", "--data-dir", dataDir, "--port", "0");
  const status = JSON.parse(run("daemon", "status", "--data-dir", dataDir, "--json"));
  const token = readFileSync(join(dataDir, "owner.token"), "utf8").trim();
  process.stdout.write(`\nJSON-RPC over ${status.url.replace("http", "ws")}/rpc with the owner token:\n`);
  const ws = new WebSocket(`${status.url.replace("http", "ws")}/rpc`, {
    headers: { authorization: `Bearer ${token}` },
  });
  await new Promise((r, j) => ws.once("open", r).once("error", j));
  for (const [id, method] of [
    [1, "daemon.whoami"],
    [2, "daemon.health"],
  ]) {
    const reply = await new Promise((r) => {
      ws.once("message", (d) => r(JSON.parse(d.toString())));
      ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params: {} }));
    });
    process.stdout.write(`  ${method} -> ${JSON.stringify(reply.result)}\n`);
  }
  ws.close();
} finally {
  try {
    run("daemon", "stop", "--data-dir", dataDir);
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
}
