"""A TCP proxy for the replication path between two sites: a link regions apart,
and the faults of one.

Each `FaultProxy` listens on 127.0.0.1 and forwards every connection to one
target port, byte for byte (real HTTP traffic: the site's replicator talks
through it). Its `LinkShape` shapes the traffic as a wide-area link would: every
chunk arrives `latency` seconds (one way, plus or minus `jitter`) after it was
sent, in order, and no faster than `bandwidth` bytes a second. Faults,
thread-safe, from the test's thread:

- `cut()`: drop every open connection and stop listening, so new ones are refused;
- `restore()`: listen again on the same port;
- `shape(link)`: change the link's latency, jitter and bandwidth from now on.

All proxies of a `ProxyHub` share one asyncio loop in one daemon thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

CHUNK = 65536
CONNECT_TIMEOUT = 10.0  # seconds: a frozen server's full backlog leaves a connect hanging
HALF_OPEN_GRACE = 5.0  # seconds the other way of a connection may outlive the first
T = TypeVar("T")


@dataclass(frozen=True)
class LinkShape:
    """How a link between two sites carries data (seconds, bytes a second)."""

    latency: float = 0.0  # one way
    jitter: float = 0.0  # each chunk's latency is latency +- up to this
    bandwidth: float | None = None  # None: as fast as the machine goes

    def delivery(self, now: float, size: int, previous: float, rng: random.Random) -> float:
        """When a chunk of `size` bytes sent at `now` arrives: after its latency, after
        the chunk before it (a stream keeps its order), and no faster than the bandwidth."""
        latency = max(0.0, self.latency + rng.uniform(-self.jitter, self.jitter))
        due = max(now + latency, previous)
        if self.bandwidth:
            due = max(due, previous + size / self.bandwidth)
        return due

    @classmethod
    def parse(cls, latency_ms: float, jitter_ms: float = 0.0,
              bandwidth_kbps: float | None = None) -> LinkShape:
        """From the bench's units: milliseconds and kilobytes a second."""
        return cls(latency_ms / 1000, jitter_ms / 1000,
                   bandwidth_kbps * 1000 if bandwidth_kbps else None)


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

    def proxy(self, listen_port: int, target_port: int,
              link: LinkShape | None = None) -> FaultProxy:
        proxy = FaultProxy(self, listen_port, target_port, link or LinkShape())
        proxy.restore()
        self.proxies.append(proxy)
        return proxy

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.cut()
        self.run(_cancel_the_other_tasks())  # e.g. a connect to a frozen server
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def _cancel_the_other_tasks() -> None:
    others = asyncio.all_tasks() - {asyncio.current_task()}
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class FaultProxy:
    def __init__(self, hub: ProxyHub, listen_port: int, target_port: int, link: LinkShape) -> None:
        self.hub = hub
        self.listen_port = listen_port
        self.target_port = target_port
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.link = link
        self.rng = random.Random(listen_port)  # jitter that replays with the same ports
        self.connections = 0  # accepted since the start
        self.dropped = 0  # connections cut while open
        self.half_open_grace = HALF_OPEN_GRACE

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

    def shape(self, link: LinkShape) -> None:
        self.link = link  # read by the pumps on the loop's thread: one reference, atomic

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
            target_reader, target_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.target_port), CONNECT_TIMEOUT)
        except (OSError, TimeoutError):
            client_writer.transport.abort()  # the site itself is down: so is the link
            return
        except asyncio.CancelledError:
            client_writer.transport.abort()  # the hub closes
            raise
        pair = {client_writer, target_writer}
        self.writers |= pair
        ways = {asyncio.ensure_future(self._pump(client_reader, target_writer)): target_writer,
                asyncio.ensure_future(self._pump(target_reader, client_writer)): client_writer}
        _, still_open = await asyncio.wait(ways, return_when=asyncio.FIRST_COMPLETED)
        if still_open:
            # One way has ended (all it carried handed over): the other may still carry
            # an answer, for a while. A client that gave up on a frozen server would
            # otherwise keep both sockets here until the server woke: two descriptors
            # a retry (the fault suite's storms ran out of them). (No client of ours
            # half-closes a connection and then waits longer for the answer.)
            _, still_open = await asyncio.wait(
                still_open, timeout=self.link.latency + self.half_open_grace)
        for way in still_open:
            way.cancel()
            ways[way].transport.abort()  # what it would still carry is given up
        await asyncio.gather(*still_open, return_exceptions=True)
        self.writers -= pair
        await asyncio.gather(*(self._close(writer) for writer in pair))

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        """Close after what is buffered for the peer has gone (a slow reader gets all of
        an answer), but within the grace: a peer that reads nothing cannot keep it."""
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), self.link.latency + self.half_open_grace)
        except (OSError, RuntimeError, TimeoutError):
            writer.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read chunks as they come and deliver each at its due time, in order: the
        reader never waits for the delivery, so latency is paid once, not per chunk."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        deliver = asyncio.ensure_future(self._deliver(queue, writer))
        loop = asyncio.get_running_loop()
        previous = 0.0
        try:
            with contextlib.suppress(OSError, RuntimeError):
                while chunk := await reader.read(CHUNK):
                    previous = self.link.delivery(loop.time(), len(chunk), previous, self.rng)
                    queue.put_nowait((previous, chunk))
            queue.put_nowait((previous, b""))  # end of stream, after the last chunk
            await deliver
        finally:
            deliver.cancel()  # (a pump stopped while reading leaves no delivery waiting)

    async def _deliver(self, queue: asyncio.Queue[tuple[float, bytes]],
                       writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError, RuntimeError):
            while True:
                due, chunk = await queue.get()
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                if not chunk:
                    break
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # end of stream one way: pass it on
