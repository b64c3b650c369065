"""The link proxy of the lab: latency once per chunk (not per chunk in a row), order
kept, bandwidth respected, and a real request through it paying the round trip."""

from __future__ import annotations

import contextlib
import random
import socket
import time

import requests

from jobdist.lab.localserver import LocalServer, free_port
from jobdist.lab.proxy import LinkShape, ProxyHub
from jobdist.lab.scenarios import regions_apart


def test_chunks_keep_their_order_and_pay_the_latency_once() -> None:
    link = LinkShape(latency=0.1, jitter=0.05)
    rng = random.Random(1)
    previous = 0.0
    due = []
    for sent in (0.0, 0.001, 0.002, 0.003):
        previous = link.delivery(sent, 100, previous, rng)
        due.append(previous)
    assert due == sorted(due)
    assert all(0.05 <= d <= 0.153 for d in due)  # a stream is late by its latency, once


def test_bandwidth_spaces_large_chunks() -> None:
    link = LinkShape(latency=0.0, bandwidth=1000.0)
    rng = random.Random(1)
    first = link.delivery(0.0, 500, 0.0, rng)
    second = link.delivery(0.0, 500, first, rng)
    assert (first, second) == (0.5, 1.0)


def test_the_design_regions() -> None:
    assert regions_apart(("global", "reg_a")).latency == 0.040
    assert regions_apart(("reg_b", "global")).latency == 0.120
    assert regions_apart(("reg_a", "reg_b")).bandwidth == 1_000_000.0


def test_a_request_through_the_proxy_pays_the_round_trip(couch_server: LocalServer) -> None:
    hub = ProxyHub()
    try:
        port = couch_server.url.rsplit(":", 1)[1]
        proxy = hub.proxy(free_port(), int(port), LinkShape(latency=0.1))
        requests.get(couch_server.url, timeout=10).raise_for_status()
        started = time.monotonic()
        answer = requests.get(proxy.url, timeout=10)
        took = time.monotonic() - started
        assert answer.json()["version"]
        assert took >= 0.2  # there and back
        proxy.shape(LinkShape())
        started = time.monotonic()
        requests.get(proxy.url, timeout=10).raise_for_status()
        assert time.monotonic() - started < 0.2
        proxy.cut()
        assert proxy.is_cut
    finally:
        hub.close()


def test_a_connection_its_client_gave_up_on_is_dropped_though_the_server_is_frozen() -> None:
    """A server that accepts nothing (stopped by a fault) keeps no socket of the proxy
    past the grace: each abandoned retry held two until the server woke."""
    frozen = socket.socket()
    hub = ProxyHub()
    try:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(100)  # connections wait in its backlog, never read nor answered
        proxy = hub.proxy(free_port(), frozen.getsockname()[1])
        proxy.half_open_grace = 0.2
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", proxy.listen_port)) as client:
                client.sendall(b"GET / HTTP/1.1\r\nHost: site\r\n\r\n")
                client.settimeout(0.01)
                with contextlib.suppress(TimeoutError):
                    client.recv(1)
        deadline = time.monotonic() + 10
        while (proxy.connections < 20 or proxy.writers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.connections == 20 and not proxy.writers
    finally:
        hub.close()
        frozen.close()
