"""Warden's Celery app: broker and beat scheduler come from Django settings (``CELERY_*``).

Workers start with ``celery -A console worker -Q warden`` and beat with ``celery -A console beat``
(see the Procfile). Tasks are discovered from each installed app's ``tasks`` module
(``agent.tasks``, ``fleet.tasks``, ``console.tasks``). The broker connection is lazy: importing
this module never touches Redis.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("warden")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
