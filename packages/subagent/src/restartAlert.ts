/**
 * The administrator alert raised once when the pool latches build_mismatch: the daemon must restart before
 * sub-agents can run again. The key is stable, so raising it again updates the same condition.
 */
export const RESTART_REQUIRED_ALERT_KEY = "core:subagent-restart-required";

export interface RestartRequiredAlert {
  readonly key: typeof RESTART_REQUIRED_ALERT_KEY;
  readonly severity: "warning";
  readonly audience: "administrators";
  readonly text: { readonly en: string; readonly cs: string; readonly sk: string };
}

export const restartRequiredAlert: RestartRequiredAlert = Object.freeze({
  key: RESTART_REQUIRED_ALERT_KEY,
  severity: "warning",
  audience: "administrators",
  text: Object.freeze({
    en: "The crw daemon was updated while running and its sub-agent runners no longer match it. Restart the crw daemon so sub-agents can run again.",
    cs: "Démon crw byl aktualizován za běhu a jeho spouštěče sub-agentů mu již neodpovídají. Restartujte démona crw, aby sub-agenti mohli znovu běžet.",
    sk: "Démon crw bol aktualizovaný počas behu a jeho spúšťače sub-agentov mu už nezodpovedajú. Reštartujte démona crw, aby sub-agenti mohli znova bežať.",
  }),
});

/** The daemon's AlertService producer, attached by daemon construction. */
export type RestartRequiredSink = (alert: RestartRequiredAlert) => void | Promise<void>;
