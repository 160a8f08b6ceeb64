"""System holds its ports from the moment it is made until it stops: nothing else can take them
while `clawproxy start` is on its way up."""

from __future__ import annotations

import errno
import socket

import pytest

from clawproxy.simulate.system import System


def _bind(port: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_ports_are_held_until_stop(tmp_path):
    system = System(tmp_path / "data")
    assert system.proxy_port != system.engine_port
    for port in (system.proxy_port, system.engine_port):
        with pytest.raises(OSError) as info:
            _bind(port)
        assert info.value.errno == errno.EADDRINUSE
        with socket.socket() as server:  # what the child does: SO_REUSEADDR, then listen
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
    system.stop()
