"""Every change of agent or fleet state an operator, the agent or the monitor makes: one ``do_*``
each, split by domain (Zulip's ``zerver/actions`` pattern: one door for writes).

Each action writes its audit row (``fleet.audit.do_audit``) and announces change topics after
commit (``fleet.events.emit``), so the UI, CLI, Celery tasks and the agent's tool layer all log
and push the same way. Import the submodule that owns the change, never this package:

- ``agent.actions.instances`` — launch, stop, destroy, reboot, resume, cordon (the agent's tools
  and an operator's fleet-page actions, through the same guards);
- ``agent.actions.session`` — the target, observe-only, a session reset;
- ``agent.actions.runs`` — an operator's chat message, a queued cycle, a rehearsal;
- ``agent.actions.settings`` — policy and limits overrides, validated;
- ``agent.actions.alerts`` — acknowledging and silencing alerts;
- ``agent.actions.notifications`` — an operator's notification settings;
- ``agent.actions.text`` — the check of text an operator types, before any effect.
"""
