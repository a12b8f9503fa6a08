from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # inside: app loading (this module loads before the apps are ready)
        from fleet.cost import track_saves
        from fleet.secrets import install_field_redaction

        install_field_redaction()  # every text column of agent and fleet is redacted where it is written
        track_saves()  # every Instance status change becomes a StatusChange row (billing periods)
