from django.apps import AppConfig


class AgentConfig(AppConfig):
    name = "agent"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agent.triggers import on_event
        from fleet.events import happened

        happened.connect(on_event, dispatch_uid="agent.triggers")
