from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from fleet.cost import track_saves

        track_saves()  # every Instance status change becomes a StatusChange row (billing periods)
