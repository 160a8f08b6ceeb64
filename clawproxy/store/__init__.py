"""The store: one SQLite database (WAL) under the data dir, split by what it stores.

- ``core.py``        the connection, migrations (``migrations.py``), transactions, row helpers
- ``turns.py``       turns and sessions: the recorder's writes, the session tracker's reads, deletion
- ``lifecycle.py``   a turn's state and its allowed moves; why a turn does not train
- ``judging.py``     the judge's queue, votes and judgments
- ``memory.py``      each user's memory: their reactions to the answers, in their own words
- ``preferences.py`` each user's candidate instructions and preferences, with their evidence
- ``training.py``    the trainer's candidates, steps, skipped turns and published checkpoints
- ``users.py``       users by a keyed hash of their API key, who shares, deleting a user
- ``views.py``       read-only views for `clawproxy stats`, the dashboard and the simulator

Each concern is a mixin over ``Core``, so every caller keeps one object, ``Store``, with one
connection and one lock. SQL lives only in this package (``tests/test_one_of_each.py``).
"""

from __future__ import annotations

from clawproxy.store.core import JSON_COLUMNS, dumps, loads
from clawproxy.store.judging import Judging
from clawproxy.store.lifecycle import (
    TRANSITIONS,
    WAITING,
    IllegalTransition,
    TurnState,
    advance,
    recorded_state,
    why_not_trained,
)
from clawproxy.store.memory import Memory
from clawproxy.store.migrations import MIGRATIONS
from clawproxy.store.preferences import Preferences
from clawproxy.store.training import Training
from clawproxy.store.turns import Link, Turns
from clawproxy.store.users import Users
from clawproxy.store.views import Views


class Store(Turns, Judging, Memory, Preferences, Training, Users, Views):
    """The SQLite store. Open with ``Store(path)``; it creates and migrates the database.

    ``Store.reader(path)`` opens an existing store read-only, for observers (the dashboard,
    /metrics) that must never take a write lock from the recorder, the judge or the trainer.
    """


__all__ = [
    "JSON_COLUMNS", "MIGRATIONS", "TRANSITIONS", "WAITING", "IllegalTransition", "Link", "Store", "TurnState",
    "advance", "dumps", "loads", "recorded_state", "why_not_trained",
]
