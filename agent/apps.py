from django.apps import AppConfig
from django.db.models.signals import post_save


class AgentConfig(AppConfig):
    name = "agent"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imports inside ready(): Django app loading (models exist only now). agent.tasks registers
        # the Celery tasks that lower rooms send by name (``current_app.tasks["agent.tasks.…"]``).
        # inside: app loading (this module loads before the apps are ready)
        import agent.tasks  # noqa: F401
        from agent.models import Approval
        from agent.runtime.triggers import on_event
        from fleet.events import happened
        from fleet.models import Alert

        post_save.connect(_approval_saved, sender=Approval, dispatch_uid="agent.notify.notifications.approval")
        post_save.connect(_alert_saved, sender=Alert, dispatch_uid="agent.notify.notifications.alert")
        happened.connect(on_event, dispatch_uid="agent.runtime.triggers")
        # inside: app loading (this module loads before the apps are ready)
        from fleet.alerts import resolved

        resolved.connect(_alert_resolved, dispatch_uid="agent.notify.notifications.alert_resolved")


def _approval_saved(sender, instance, created, **kwargs):
    """A newly parked call notifies the operators who want ``approval_new`` (``agent.notify.notifications``)."""
    if created and instance.status == "waiting" and not kwargs.get("raw"):
        # inside: app loading (this module loads before the apps are ready)
        from agent.notify.notifications import approval_parked

        approval_parked(instance)


def _alert_saved(sender, instance, created, **kwargs):
    """A new P0/P1 alert notifies (``agent.notify.notifications.alert_routes``); fleet never imports agent."""
    if created and not kwargs.get("raw"):
        # inside: app loading (this module loads before the apps are ready)
        from agent.notify.notifications import alert_raised

        alert_raised(instance)


def _alert_resolved(sender, alert, **kwargs):
    """An alert's episode ended: the operators its raise notified hear so (``agent.notify.notifications``)."""
    # inside: app loading (this module loads before the apps are ready)
    from agent.notify.notifications import alert_resolved

    alert_resolved(alert)
