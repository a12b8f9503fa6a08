"""Shared test set-up: PostgreSQL test databases for both aliases, HarmonyDB tables, named users.

``make test`` points DATABASE_URL / HARMONY_DATABASE_URL / REDIS_URL at the local servers.
"""

import os

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import Group, User
from hypothesis import settings as hypothesis_settings

# The fuzz and property tests are the same every run (a CI run is a verdict, not a lottery); run
# them with HYPOTHESIS_PROFILE=explore to draw new examples.
hypothesis_settings.register_profile("warden", derandomize=True, deadline=None)
hypothesis_settings.register_profile("explore", deadline=None, max_examples=1000)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "warden"))


def _redis_per_xdist_worker() -> None:
    """Under pytest-xdist (``make test`` runs ``-n``), worker ``gwN`` uses Redis db ``base + N``
    (mod 16) of the same server, so the tests that read the broker queue, the trigger keys or
    beat's tick never see another worker's. The test databases get their ``_gwN`` suffix from
    pytest-django itself. Settings are already loaded when this file is imported (pytest-django
    loads them first), so the Redis settings are rewritten here, and ``REDIS_URL`` in the
    environment too for the processes the tests start."""
    from urllib.parse import urlsplit

    from django.conf import settings

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or worker == "gw0" or settings.REDIS_EMBEDDED:
        return
    parts = urlsplit(settings.REDIS_URL)
    base = int(parts.path.strip("/") or 0)
    url = parts._replace(path=f"/{(base + int(worker[2:])) % 16}").geturl()
    settings.REDIS_URL = settings.CELERY_BROKER_URL = os.environ["REDIS_URL"] = url
    for layer in settings.CHANNEL_LAYERS.values():
        for host in layer.get("CONFIG", {}).get("hosts", []):
            host["address"] = url
    from console.celery import app

    app.conf.broker_url = url


_redis_per_xdist_worker()


def _fast_password_hashing() -> None:
    """Hash the tests' passwords with PBKDF2 at 1,000 iterations instead of Django's 1,000,000
    (about 0.35 s a hash here, paid by every ``alice``/``bob`` fixture and every login). The hasher
    is Django's own, under the same algorithm name: a hash written here is checked by the default
    hasher in the processes the tests start (it reads the iterations from the hash), and the login
    throttle, the password checks and the user pages run the same code."""
    from django.conf import settings
    from django.contrib.auth import hashers

    settings.PASSWORD_HASHERS = ["tests.conftest.FewIterationsPBKDF2", *settings.PASSWORD_HASHERS]
    hashers.get_hashers.cache_clear()
    hashers.get_hashers_by_algorithm.cache_clear()


class FewIterationsPBKDF2(PBKDF2PasswordHasher):
    """Django's PBKDF2-SHA256 hasher at 1,000 iterations (tests only; see ``_fast_password_hashing``)."""

    iterations = 1000


_fast_password_hashing()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """After pytest-django builds the test databases, create the HarmonyDB tables on ``harmony``."""
    from django.db import connections

    from fleet.harmony import ensure_schema

    name = str(connections["harmony"].settings_dict["NAME"])
    if "test" in name:  # set up only when some collected test asked for the harmony alias
        with django_db_blocker.unblock():
            ensure_schema("harmony")


@pytest.fixture
def alice(db):
    """An operator: acts and approves."""
    user = User.objects.create_user("alice", password="alice-pass-1")
    group, _ = Group.objects.get_or_create(name="operators")
    user.groups.add(group)
    return user


@pytest.fixture
def bob(db):
    """A viewer: sees everything, actions disabled."""
    user = User.objects.create_user("bob", password="bob-pass-1")
    group, _ = Group.objects.get_or_create(name="viewers")
    user.groups.add(group)
    return user


@pytest.fixture
def broker_queue():
    """The test Celery queue, emptied before and after the test (tests read what reached it)."""
    from tests.console_support import purge_broker

    purge_broker()
    yield
    purge_broker()


@pytest.fixture(autouse=True)
def _fresh_token_calibration():
    """Each test starts with an uncalibrated token estimate (agent.memory.context keeps it per process)."""
    from agent.memory.context import CALIBRATION

    CALIBRATION.factor = 1.0
    yield
    CALIBRATION.factor = 1.0


@pytest.fixture(autouse=True)
def _fresh_model_windows():
    """Each test starts with no remembered context window: windows are kept per process by
    ``(base_url, model)``, and a stand-in server of a later test can get the loopback port an
    earlier one had (which once gave a 131,072-token server an 8,192-token budget)."""
    from agent.model import model_client

    model_client._WINDOWS.clear()
    yield
    model_client._WINDOWS.clear()


def pytest_collection_modifyitems(config, items):
    """Browser and real-worker integration tests count as ``slow``: ``make test`` leaves them out,
    ``make test-slow`` (and CI, after ``make test``) runs them."""
    for item in items:
        if item.get_closest_marker("browser") or item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.slow)
