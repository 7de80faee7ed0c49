import { CONNECTION_HELP, inputError, type Options, out, parse, parseOrExit, withClient } from "./common.js";

const ACCOUNT_HELP = `Usage: crw account <command> [options]

Commands:
  create NAME [--admin] [--allow T,…] [--deny T,…]
                          make an account (--admin: an administrator; only the owner makes them)
  list                    the accounts and their tool grants
  grant NAME [--allow T,…|--allow-all] [--deny T,…]
                          set the tools an account's sessions may use: --allow the only tools (entries
                          like Bash, Read, Bash(git *)), --allow-all every tool, --deny refused even when
                          allowed (--deny '' clears it)

Only the owner and administrators manage accounts.

${CONNECTION_HELP}`;

const TOKEN_HELP = `Usage: crw token <command> [options]

Commands:
  issue ACCOUNT [--label L]   issue an API token for ACCOUNT (a name or id); it is printed once and only
                              its hash is kept, so store it now
  list [--account A]          the tokens (their ids, never the tokens) and whether each is revoked
  revoke ID                   revoke a token: every daemon of the database refuses it at once and
                              closes the connections opened with it

Only the owner and administrators manage tokens.

${CONNECTION_HELP}`;

interface AccountView {
  id: string;
  name: string;
  owner: boolean;
  administrator: boolean;
  allow: string[] | null;
  deny: string[];
}

interface TokenView {
  id: string;
  account: string;
  label: string;
  createdAt: string;
  revokedAt: string | null;
}

/** A comma-separated list of tool entries; an empty text is the empty list. */
const listOf = (v: unknown): string[] | undefined =>
  typeof v === "string"
    ? v
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean)
    : undefined;

const grantsText = (a: AccountView) =>
  `${a.allow === null ? "every tool" : a.allow.length ? `only ${a.allow.join(", ")}` : "no tool"}${a.deny.length ? `, never ${a.deny.join(", ")}` : ""}`;

const role = (a: AccountView) => (a.owner ? "owner" : a.administrator ? "administrator" : "account");

const accountLine = (a: AccountView) => `${a.name.padEnd(24)} ${role(a).padEnd(14)} ${grantsText(a)}`;

export async function runAccountCli(args: string[]): Promise<number> {
  const P = "crw account";
  const parsed = parseOrExit(P, () =>
    parse(args, {
      admin: { type: "boolean" },
      allow: { type: "string" },
      "allow-all": { type: "boolean" },
      deny: { type: "string" },
    }),
  );
  if (typeof parsed === "number") return parsed;
  const { values, positionals } = parsed;
  const [command, name, extra] = positionals;
  if (values.help || !command) {
    out(ACCOUNT_HELP);
    return values.help ? 0 : 2;
  }
  if (extra) return inputError(P, `unexpected '${extra}'; see 'crw account --help'`);
  const json = values.json === true;
  if (values.allow !== undefined && values["allow-all"])
    return inputError(P, "--allow and --allow-all exclude each other");
  const allow = values["allow-all"] ? null : listOf(values.allow);
  const deny = listOf(values.deny);
  switch (command) {
    case "create":
      if (!name) return inputError(P, "create needs NAME; see 'crw account --help'");
      return withClient(P, values, async (client) => {
        const a = await client.call<AccountView>("account.create", {
          name,
          ...(values.admin ? { administrator: true } : {}),
          ...(allow !== undefined ? { allow } : {}),
          ...(deny !== undefined ? { deny } : {}),
        });
        out(
          json
            ? JSON.stringify({ ok: true, ...a })
            : `account ${a.name} (${role(a)}): ${grantsText(a)}; issue it a token with 'crw token issue ${a.name}'`,
        );
        return 0;
      });
    case "list":
      if (name) return inputError(P, `unexpected '${name}'; see 'crw account --help'`);
      return withClient(P, values, async (client) => {
        const r = await client.call<{ accounts: AccountView[] }>("account.list", {});
        if (json) out(JSON.stringify({ ok: true, ...r }));
        else for (const a of r.accounts) out(accountLine(a));
        return 0;
      });
    case "grant":
      if (!name) return inputError(P, "grant needs NAME; see 'crw account --help'");
      if (allow === undefined && deny === undefined)
        return inputError(P, "grant needs --allow, --allow-all or --deny");
      return withClient(P, values, async (client) => {
        const a = await client.call<AccountView>("account.grant", {
          account: name,
          ...(allow !== undefined ? { allow } : {}),
          ...(deny !== undefined ? { deny } : {}),
        });
        out(json ? JSON.stringify({ ok: true, ...a }) : accountLine(a));
        return 0;
      });
    default:
      return inputError(P, `unknown command '${command}'; see 'crw account --help'`);
  }
}

const tokenLine = (t: TokenView) =>
  `${t.id}  ${t.account.padEnd(24)} ${t.revokedAt ? `revoked ${t.revokedAt}` : `issued ${t.createdAt}`}${t.label ? `  ${t.label}` : ""}`;

export async function runTokenCli(args: string[]): Promise<number> {
  const P = "crw token";
  const parsed = parseOrExit(P, () =>
    parse(args, { label: { type: "string" }, account: { type: "string" } }),
  );
  if (typeof parsed === "number") return parsed;
  const { values, positionals } = parsed;
  const [command, arg, extra] = positionals;
  if (values.help || !command) {
    out(TOKEN_HELP);
    return values.help ? 0 : 2;
  }
  if (extra) return inputError(P, `unexpected '${extra}'; see 'crw token --help'`);
  return tokenCommand(P, command, arg, values);
}

function tokenCommand(
  P: string,
  command: string,
  arg: string | undefined,
  values: Options,
): Promise<number> | number {
  const json = values.json === true;
  switch (command) {
    case "issue":
      if (!arg) return inputError(P, "issue needs ACCOUNT; see 'crw token --help'");
      return withClient(P, values, async (client) => {
        const t = await client.call<{ token: string; id: string; account: string }>("token.issue", {
          account: arg,
          ...(typeof values.label === "string" ? { label: values.label } : {}),
        });
        if (json) out(JSON.stringify({ ok: true, ...t }));
        else {
          out(t.token);
          process.stderr.write(
            `token ${t.id} for ${t.account}: shown this once; revoke it with 'crw token revoke ${t.id}'\n`,
          );
        }
        return 0;
      });
    case "list":
      if (arg) return inputError(P, `unexpected '${arg}'; see 'crw token --help'`);
      return withClient(P, values, async (client) => {
        const r = await client.call<{ tokens: TokenView[] }>("token.list", {
          ...(typeof values.account === "string" ? { account: values.account } : {}),
        });
        if (json) out(JSON.stringify({ ok: true, ...r }));
        else for (const t of r.tokens) out(tokenLine(t));
        return 0;
      });
    case "revoke":
      if (!arg) return inputError(P, "revoke needs ID (see 'crw token list'); see 'crw token --help'");
      if (!/^[0-9a-f]{12}$/.test(arg))
        return inputError(P, `'${arg}' is not a token id (12 hexadecimal characters, from 'crw token list')`);
      return withClient(P, values, async (client) => {
        const t = await client.call<TokenView>("token.revoke", { id: arg });
        out(json ? JSON.stringify({ ok: true, ...t }) : `revoked ${t.id} of ${t.account}`);
        return 0;
      });
    default:
      return inputError(P, `unknown command '${command}'; see 'crw token --help'`);
  }
}
