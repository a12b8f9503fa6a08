"""A throwaway redis-server on a free loopback port, for tests that kill and restart the broker.

Never the shared test Redis: this one is started by the test, SIGKILLed by it (``kill -9``, as an
outage) and started again on the same port with no persistence (a Redis that lost its data).
"""

import signal
import subprocess
import time

import redis

from tests.subprocs import free_port


class RedisServer:
    """``redis-server --port PORT`` with no persistence; :meth:`kill` is SIGKILL, :meth:`start` again."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            for _ in range(200):
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    time.sleep(0.05)
            raise RuntimeError(f"redis-server on port {self.port} did not answer")
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
