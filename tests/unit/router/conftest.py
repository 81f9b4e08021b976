"""Fixtures for router tests: the fake cloud on 127.0.0.1, and a guard against leaving the machine.

``net_guard`` (autouse here) watches every socket connect and name lookup through a Python audit
hook: any attempt to reach a non-loopback address fails with ``ConnectionRefusedError`` and is
recorded, and the test fails unless it declared that it expects such attempts.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from router_fake_cloud import GUARD, FakeCloud, NetGuard, activate_guard


@pytest.fixture
def fake_cloud() -> Iterator[FakeCloud]:
    cloud = FakeCloud()
    cloud.start()
    try:
        yield cloud
    finally:
        cloud.stop()


@pytest.fixture(autouse=True)
def net_guard() -> Iterator[NetGuard]:
    activate_guard()
    try:
        yield GUARD
    finally:
        GUARD.active = False
    if not GUARD.expect_attempts:
        assert GUARD.attempts == [], f"a router test tried to leave the machine: {GUARD.attempts}"
