from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # inside: app loading (this module loads before the apps are ready)
        from django.contrib.auth.signals import user_logged_out

        from console import auth, broadcast  # noqa: F401 — auth: the login_lockout alert's receiver
        from fleet.events import changed, streamed

        changed.connect(broadcast.on_changed, dispatch_uid="console.broadcast")
        streamed.connect(broadcast.on_streamed, dispatch_uid="console.chat_stream")
        user_logged_out.connect(broadcast.on_logged_out, dispatch_uid="console.logout")
