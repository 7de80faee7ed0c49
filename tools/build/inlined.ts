/**
 * Third-party modules bundled into crw's builds instead of loaded from node_modules at run time.
 *
 * The agent loop's libraries ship as hundreds of small ES modules (typebox alone is about 700 files), and
 * a process pays to resolve, read and compile each one: importing them from node_modules cost about half a
 * second of CPU, bundled about 60 ms. Every process that runs a model turn pays it once (a crw flow run
 * process, a runner's first turn). Only @crw/brain imports them, so each build that carries the brain (its
 * own, and the runner's) holds the one copy its process loads; pi-ai keeps registries at module level, so
 * pi-agent-core must reach the same copy, which it does when both are bundled together.
 *
 * The vendor SDKs behind pi-ai's providers stay in node_modules: pi-ai imports each on first use only.
 */
export const inlinedDependencies: RegExp[] = [/^typebox(\/|$)/, /^@mariozechner\/pi-(ai|agent-core)(\/|$)/];
