"""A fault-injecting TCP proxy, for the replication path between two sites.

Each `FaultProxy` listens on 127.0.0.1 and forwards every connection to one
target port, byte for byte (real HTTP traffic: the site's replicator talks
through it). Faults, thread-safe, from the test's thread:

- `cut()`: drop every open connection and stop listening, so new ones are refused;
- `restore()`: listen again on the same port;
- `delay(seconds)`: hold each forwarded chunk that long (a slow link).

All proxies of a `ProxyHub` share one asyncio loop in one daemon thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

CHUNK = 65536
T = TypeVar("T")


class ProxyHub:
    """An event loop in a thread of its own, serving any number of proxies."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fault-proxies",
                                       daemon=True)
        self.thread.start()
        self.proxies: list[FaultProxy] = []

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def proxy(self, listen_port: int, target_port: int) -> FaultProxy:
        proxy = FaultProxy(self, listen_port, target_port)
        proxy.restore()
        self.proxies.append(proxy)
        return proxy

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.cut()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class FaultProxy:
    def __init__(self, hub: ProxyHub, listen_port: int, target_port: int) -> None:
        self.hub = hub
        self.listen_port = listen_port
        self.target_port = target_port
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.latency = 0.0
        self.connections = 0  # accepted since the start
        self.dropped = 0  # connections cut while open

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    @property
    def is_cut(self) -> bool:
        return self.server is None

    def cut(self) -> None:
        self.hub.run(self._cut())

    def restore(self) -> None:
        self.hub.run(self._listen())

    def delay(self, seconds: float) -> None:
        self.latency = seconds  # read by the pumps on the loop's thread: a float is atomic

    async def _listen(self) -> None:
        if self.server is None:
            self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.listen_port,
                                                     reuse_address=True)

    async def _cut(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        self.dropped += len(self.writers) // 2  # two writers per connection
        for writer in list(self.writers):
            writer.transport.abort()  # a reset, as a broken link gives
        self.writers.clear()

    async def _serve(self, client_reader: asyncio.StreamReader,
                     client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            target_reader, target_writer = await asyncio.open_connection("127.0.0.1",
                                                                         self.target_port)
        except OSError:
            client_writer.transport.abort()  # the site itself is down: so is the link
            return
        pair = {client_writer, target_writer}
        self.writers |= pair
        await asyncio.gather(self._pump(client_reader, target_writer),
                             self._pump(target_reader, client_writer))
        self.writers -= pair
        for writer in pair:
            writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            while chunk := await reader.read(CHUNK):
                if self.latency:
                    await asyncio.sleep(self.latency)
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # end of stream one way: pass it on
