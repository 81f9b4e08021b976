"""The TUI's link to the daemon: one AsyncClient, reconnected after the daemon goes away.

``get()`` connects on demand (starting the daemon when ``autostart``); a connection error drops
the client so the next ``get()`` dials again, which is how the app recovers when the daemon
comes back. ``describe`` turns a ``DaemonError`` into one line that says what to do.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from openjarvis.daemon.client import AsyncClient
from openjarvis.daemon.protocol import ErrorCode
from openjarvis.errors import DaemonError

ADVICE: dict[int, str] = {
    ErrorCode.MODEL_UNAVAILABLE: "see `jarvis models list`; `jarvis doctor` checks the setup",
    ErrorCode.POLICY_REFUSED: "type /local to answer here, or allow the cloud: `jarvis config set router.cloud auto`",
    ErrorCode.CLOUD_ERROR: "type /local to answer on this machine",
    ErrorCode.WORKSPACE_ERROR: "run jarvis inside a repository, or check the path",
    ErrorCode.SHUTTING_DOWN: "the daemon is stopping; the next request starts it again",
    ErrorCode.INTERNAL_ERROR: "details in `jarvis daemon logs`",
}


def describe(exc: DaemonError) -> str:
    """The error's own line plus what to do, unless the line already says it."""
    msg = str(exc)
    if exc.code is None:
        if "daemon" not in msg:
            msg = f"lost the daemon: {msg}"
        return f"{msg}. Jarvis reconnects on its own; or run `jarvis daemon start`"
    advice = ADVICE.get(exc.code)
    return f"{msg} ({advice})" if advice and "`" not in msg else msg


class Connection:
    def __init__(self, socket_path: Path | None = None, *, autostart: bool = True, name: str = "jarvis-tui") -> None:
        self.socket_path = socket_path
        self.autostart = autostart
        self.name = name
        self.client: AsyncClient | None = None
        self._lock = asyncio.Lock()

    @property
    def alive(self) -> bool:
        """Whether the current client still has its connection (its reader has not seen EOF)."""
        return self.client is not None and not self.client.closed

    async def get(self) -> AsyncClient:
        async with self._lock:
            if self.client is not None and not self.alive:
                await self.drop()
            if self.client is None:
                client = AsyncClient(self.socket_path, client_name=self.name, autostart=self.autostart)
                try:
                    await client.connect()
                except (OSError, DaemonError) as exc:
                    await client.close()
                    if isinstance(exc, DaemonError):
                        raise
                    raise DaemonError(f"cannot reach the daemon ({exc})") from exc
                self.client = client
            return self.client

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        client = await self.get()
        try:
            return await client.call(method, params)
        except DaemonError as exc:
            if exc.code is None:
                await self.drop(client)
            raise
        except (OSError, ConnectionError) as exc:
            await self.drop(client)
            raise DaemonError(f"the daemon closed the connection ({exc})") from exc

    async def drop(self, client: AsyncClient | None = None) -> None:
        """Forget the client (when it is ``client``, or any); the next ``get`` reconnects."""
        if self.client is not None and (client is None or client is self.client):
            old, self.client = self.client, None
            await old.close()

    async def close(self) -> None:
        await self.drop()
