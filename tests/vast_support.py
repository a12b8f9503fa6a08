"""The ``vast`` fixture: the local vast.ai server (``tests.vast_server``) with Warden's settings
pointed at it — ``settings.VAST`` (URL, key by reference, fast pacing) and
``WARDEN["PROVIDER"] = "vastai"``. The key lives in an environment variable whose NAME is the
setting; :data:`KEY` is a 64-hex string shaped like a real vast key.
"""

import pytest

KEY = "3f9c2b7a1d4e8f60a5b3c7d9e1f2a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8"
KEY_ENV = "WARDEN_TEST_VAST_KEY"


def vast_config(url: str, **over) -> dict:
    """``settings.VAST`` for the test server: no pacing delay, 429 backoff in milliseconds."""
    return {
        "URL": url, "API_KEY_ENV": KEY_ENV, "API_KEY_FILE": "", "IMAGE": "warden/curio-worker:test", "DISK_GB": 40.0,
        "ENV": "-e CURIO_LAYERS=/data", "ONSTART": "touch ~/.no_auto_tmux",
        "OFFER_QUERY": "num_gpus=1 reliability>=0.95 cuda_vers>=12.0", "OFFER_TYPE": "on-demand",
        "LABEL_PREFIX": "warden-", "MIN_INTERVAL_S": 0.0, "RETRY_429": 4, "BACKOFF_S": 0.01, "BACKOFF_MAX_S": 0.05,
        "TIMEOUT_S": 5.0, **over,
    }


@pytest.fixture
def vast(settings, monkeypatch):
    """A running :class:`tests.vast_server.VastServer`; Warden's vast settings point at it."""
    from fleet.providers.vastai import PACER
    from tests.vast_server import VastServer

    monkeypatch.setenv(KEY_ENV, KEY)
    server = VastServer(KEY).start()
    settings.VAST = vast_config(server.url)
    settings.WARDEN = {**settings.WARDEN, "PROVIDER": "vastai"}
    PACER.reset()
    try:
        yield server
    finally:
        server.stop()
        PACER.reset()
