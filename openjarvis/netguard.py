"""The offline promise in one place: with offline on, only loopback addresses may be contacted.

Every outbound connection Open Jarvis makes (model downloads, cloud targets) asks this module
first, so a single test can prove that offline mode opens no connection beyond 127.0.0.0/8 / ::1.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from openjarvis.errors import JarvisError, SourceUnavailable

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_allowed(url: str, *, offline: bool, error: type[JarvisError] = SourceUnavailable) -> None:
    """Raise ``error`` before any byte is sent to a non-loopback host while offline.

    Callers pass their own error class (the router passes ``CloudOffline``) so the refusal lands in
    the part of the error tree their callers already catch.
    """
    if offline and not is_loopback(url):
        raise error(
            f"offline mode: refusing to connect to {urlsplit(url).hostname}; "
            "turn it off with `jarvis config set router.offline false` or drop --offline"
        )
