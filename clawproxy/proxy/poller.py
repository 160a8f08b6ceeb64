"""The proxy's one reader of the store's state: every ``POLL_S`` a thread reads it for each reader
(routing's users and adapters, trying's plans), through one read-only connection, never on the
request path.

A reader has ``read(store)``; a reader that fails is logged and read again at the next poll, the
others are read as usual. ``unreadable()``, where a reader has it, is called when the store could
not be read before serving (a broken or missing store: the recorder spools meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from clawproxy.store import Store

log = logging.getLogger("clawproxy.proxy.poller")

POLL_S = 1.0


class Poller:
    """Reads the store for its readers: once before serving, then in a named task owned here."""

    def __init__(self, db_path: str | Path, readers: Sequence[Any]):
        self.db_path = db_path
        self.readers = list(readers)
        self._store: Store | None = None
        self._lock = threading.Lock()  # a test's read and the poll's may overlap: one at a time

    def once(self) -> list[Any]:
        """Read the store for every reader now (a thread: SQLite blocks); the readers that failed."""
        with self._lock:
            try:
                if self._store is None:
                    self._store = Store.reader(self.db_path)  # after the recorder migrated it
            except Exception:  # a store hiccup must not end the polling; the next poll tries again
                log.exception("poller: cannot open the store read-only")
                return list(self.readers)
            failed = []
            for reader in self.readers:
                try:
                    reader.read(self._store)
                except Exception:
                    log.exception("poller: %s failed to read the store", type(reader).__name__)
                    failed.append(reader)
            return failed

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            await asyncio.to_thread(self.once)

    async def ctx(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: read once before serving, then poll."""
        for reader in await asyncio.to_thread(self.once):
            if callable(getattr(reader, "unreadable", None)):
                await asyncio.to_thread(reader.unreadable)
        task = asyncio.create_task(self._poll(), name="clawproxy-poller")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
