/**
 * Every refusal of the scope module. A scope is authority, so nothing here is retryable: the same input is
 * refused the same way until the caller changes it. Across processes match on `name` and `code`.
 */
export type DelegatedScopeErrorCode =
  | "invalid_scope"
  | "scope_limit_exceeded"
  | "dream_not_host_minted"
  | "dream_account_mismatch"
  | "invalid_authority"
  | "invalid_work_dir"
  | "work_dir_outside_project"
  | "work_dir_unavailable"
  | "work_dir_not_permitted";

export class DelegatedScopeError extends Error {
  override readonly name = "DelegatedScopeError";
  readonly retryable = false;
  constructor(
    readonly code: DelegatedScopeErrorCode,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
  ) {
    super(message);
  }
}
