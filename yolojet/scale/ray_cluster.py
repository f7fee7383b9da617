"""Joining a Ray cluster, or starting one on this machine, for `label --ray` and `serve --ray` (ray is imported
when called)."""

from __future__ import annotations

import logging
import signal
import socket
import threading

from yolojet.errors import EngineConfigError

# ray.init retries an address that answers nothing for minutes, printing a warning every few seconds; a head that
# does not take a TCP connection in 5 s is not there.
CONNECT_TIMEOUT_S = 5.0
GCS_PORT = 6379  # `ray start --head`'s default
CLIENT_PORT = 10001  # Ray Client's server, for ray://HOST


def head_of(address: str) -> tuple[str, int] | None:
    """The host and port a cluster address names (HOST, HOST:PORT, ray://HOST[:PORT], [IPv6]:PORT), or None for the
    words ray.init resolves itself ("auto": the cluster `ray start` began on this machine; "local": a new one)."""
    if address in ("auto", "local"):
        return None
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://")
    host, colon, port = rest.rpartition(":")
    if not colon or "]" in port:  # no port given (an IPv6 literal's own colons sit inside its brackets)
        host, port = rest, str(CLIENT_PORT if client else GCS_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EngineConfigError(
            f"--ray {address}: expected HOST:PORT (the head of `ray start --head`), "
            "ray://HOST:PORT (Ray Client) or auto"
        )
    return host, int(port)


def connect(address: str | None) -> bool:
    """Join the Ray cluster at `address`, or start one on this machine when it is None or empty. True when this call
    began Ray in this process (so that `close` ends it); a process on a cluster already labels on that one."""
    import ray

    head = head_of(address) if address else None
    if head is not None:
        try:
            socket.create_connection(head, timeout=CONNECT_TIMEOUT_S).close()
        except OSError as e:
            hint = "is `ray start --head` running on that machine, its port open to this one?"
            raise EngineConfigError(f"--ray {address}: cannot reach the Ray cluster there ({e}); {hint}") from None
    if ray.is_initialized():
        return False
    # Ray's driver installs a SIGTERM handler of its own that prints a crash report; the command's handler (which
    # ends a labeling run as Ctrl-C does) is put back.
    on_main_thread = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if on_main_thread else None
    try:
        if address:
            ray.init(address=address, logging_level=logging.WARNING)
        else:  # the dashboard is a web server and a second set of processes a labeling run does not look at
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
        if callable(handler):
            signal.signal(signal.SIGTERM, handler)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        if not address:
            raise EngineConfigError(f"--ray: cannot start Ray here ({e})") from None
        # A head that takes connections but not this driver: most often Ray's token authentication, which a driver
        # joining a cluster uses only when told to.
        hint = "for a cluster with token authentication, set RAY_AUTH_MODE=token and give this machine its token"
        raise EngineConfigError(f"--ray {address}: cannot join the Ray cluster there ({e}); {hint}") from None
    return True
