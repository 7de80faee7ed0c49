/**
 * The texts a step carries. The spawn message is short and exactly in the seed's form; the packet (a file
 * the subagent reads) holds the rest and is self-contained.
 */

export function markerOf(call: string, k: number, attempt: number): string {
  return `${call}/t${k}-a${attempt}`;
}

export function markerLine(marker: string): string {
  return `crw-flow-op: ${marker}`;
}

export function spawnMessage(marker: string, role: string, workspace: string, packetPath: string): string {
  return [
    markerLine(marker),
    `CRW-ROLE: ${role}`,
    "",
    `Your shell starts in a directory that is NOT your workspace. Your workspace is ${workspace}: run every command with workdir ${workspace} and edit only by absolute paths under ${workspace}.`,
    `Read the task packet ${packetPath} in full and follow it exactly. You are a leaf subagent: never spawn agents.`,
    "Your final message is exactly the JSON object the packet names, and nothing else.",
    "",
  ].join("\n");
}

/** A send_input message: the marker line, then the turn's input. */
export function sendInputMessage(marker: string, input: string): string {
  return `${markerLine(marker)}\n${input}`;
}

/** The marker a user message carries on its first line, or null. */
export function markerInText(text: string): string | null {
  const first = text.split("\n", 1)[0] ?? "";
  const m = /^crw-flow-op: (\S+)\s*$/.exec(first);
  return m?.[1] ?? null;
}
