"""ASGI entry point: Django over HTTP, the console websocket at ``/ws/console/``.

``AllowedHostsOriginValidator`` is the websocket's CSRF defence (Origin must be an allowed host);
``AuthMiddlewareStack`` puts the session's user in ``scope["user"]``. Static files (htmx, its ws
extension, console.css/js) are served by ``ASGIStaticFilesHandler`` under ``STATIC_URL`` so a bare
``daphne console.asgi:application`` serves a working console without a separate web server.
"""

import atexit
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

from console.consumers import ConsoleConsumer  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter([path("ws/console/", ConsoleConsumer.as_asgi())]))
        ),
    }
)

from console.shutdown import say_shutdown  # noqa: E402

if "pytest" not in sys.modules:  # the console's process (daphne), not a test that imports it
    atexit.register(say_shutdown)  # Ctrl-C: say that the demo's workers keep running and how to end them
