"""Test-only: every socket connect off loopback is recorded and refused before it is made.

The hostile tests' traps point at addresses that must never be reached (169.254.169.254, a
refused host, hosts minted by the thousand). The crawler's guards refuse them; this hook
makes sure that, even if a guard broke, no packet leaves loopback: a ``socket.connect``
(or ``sendto``/``sendmsg``) to anything but an IPv4 address in 127.0.0.0/8 or a Unix socket
is appended to the file named by :data:`ENV` and fails with ``PermissionError``. The audit
event is raised before the system call, so nothing is sent.

Loaded by ``sitecustomize`` (this directory on ``PYTHONPATH``) in every process a hostile
test starts, and installed in the test process itself. An audit hook cannot be removed, so
it acts only while :data:`ENV` is set (the tests set it with ``monkeypatch``). Sockets made
in C are not audited: librdkafka's (the broker is on 127.0.0.1) and uvloop's, which is why
processes started under the audit run the fetch stage on asyncio's own loop (see
:func:`install_in_child`).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import sys
from typing import Any

#: The file refused connects are appended to; unset, the hook does nothing.
ENV = "HOSTILE_CONNECT_AUDIT"
_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
_EVENTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg"})
_installed = False


def allowed(family: int, address: Any) -> bool:
    """A Unix socket, or an IPv4 literal in 127.0.0.0/8 (a name is not judged: refused)."""
    if family == getattr(socket, "AF_UNIX", None):
        return True
    if family != socket.AF_INET or not isinstance(address, tuple) or not address:
        return False
    try:
        return ipaddress.IPv4Address(address[0]) in _LOOPBACK
    except ValueError:
        return False


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event not in _EVENTS:
        return
    path = os.environ.get(ENV)
    if not path:
        return
    sock, address = args[0], args[1]
    if address is None:  # sendmsg on a connected socket: its connect was judged already
        return
    family = int(getattr(sock, "family", -1))
    if allowed(family, address):
        return
    line = f"{os.getpid()} {event} family={family} {address!r} {' '.join(sys.argv[:4])}\n"
    with open(path, "a") as f:
        f.write(line)
    raise PermissionError(errno.EACCES, f"{event} to {address!r} refused by the test audit "
                          "hook: hostile tests stay on loopback")


def install() -> None:
    """Register the hook, once per process (it acts while :data:`ENV` is set)."""
    global _installed
    if _installed:
        return
    _installed = True
    sys.addaudithook(_hook)


def install_in_child() -> None:
    """``sitecustomize``: the hook, and for a process started under the audit (a worker of
    a hostile test) asyncio's own event loop instead of uvloop's, whose connects are made
    in C and would pass unaudited. Not for the test process: its later tests keep uvloop."""
    install()
    if os.environ.get(ENV):
        # ``import uvloop`` now raises ImportError: the fetch stage falls back to asyncio.
        sys.modules.setdefault("uvloop", None)  # type: ignore[assignment]
