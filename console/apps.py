from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from console import broadcast
        from fleet.events import changed

        changed.connect(broadcast.on_changed, dispatch_uid="console.broadcast")
        user_logged_out.connect(broadcast.on_logged_out, dispatch_uid="console.logout")
