"""Users: who may talk to the proxy, by a keyed hash of their API key, and who shares.

A user's rows (sessions, turns and what hangs off them, train steps, checkpoints) carry their name
in a ``user`` column; NULL is the one user of a proxy with no users, and, on checkpoints and train
steps, the shared adapter.
"""

from __future__ import annotations

import time
from typing import Any

from clawproxy.store.core import Core


class Users(Core):
    def add_user(self, name: str, key_hash: str | None, *, shared: bool = False) -> None:
        """Add a user (``StoreError``-free: the caller checks ``get_user`` first for a clear message)."""
        self.insert("users", {"name": name, "key_hash": key_hash, "shared": int(shared),
                              "created_at": time.time()})

    def get_user(self, name: str) -> dict[str, Any] | None:
        return self.query_one("SELECT * FROM users WHERE name=?", (name,))

    def user_by_key_hash(self, key_hash: str) -> dict[str, Any] | None:
        return self.query_one("SELECT * FROM users WHERE key_hash=?", (key_hash,))

    def list_users(self) -> list[dict[str, Any]]:
        """Every user with their turn count and newest adapter version (None: none yet)."""
        return self.query(
            """SELECT u.name, u.shared, u.created_at, u.key_hash,
                      (SELECT COUNT(*) FROM turns t WHERE t.user = u.name) AS turns,
                      (SELECT MAX(version) FROM checkpoints c
                        WHERE c.user = u.name AND c.status = 'published') AS version
               FROM users u ORDER BY u.name""")

    def user_keys(self) -> list[dict[str, Any]]:
        """Every user's name, key_hash and shared: the proxy's key map (read every second, so no counts)."""
        return self.query("SELECT name, key_hash, shared FROM users")

    def user_names(self) -> list[str]:
        """Every user's name, sorted (the dashboard's picker: no counts to compute)."""
        return [r["name"] for r in self.query("SELECT name FROM users ORDER BY name")]

    def owners(self) -> list[str | None]:
        """Whose adapters the trainer trains: the shared one (None) and each user's."""
        return [None, *self.user_names()]

    def has_users(self) -> bool:
        return self.query_one("SELECT 1 AS x FROM users LIMIT 1") is not None

    def set_trying(self, name: str, on: bool) -> None:
        self.update("users", "name", name, {"trying": int(on)})

    def users_not_tried(self) -> list[str]:
        return [r["name"] for r in self.query("SELECT name FROM users WHERE trying = 0")]

    def set_shared(self, name: str, shared: bool) -> None:
        self.update("users", "name", name, {"shared": int(shared)})

    def shared_users(self) -> list[str]:
        return [r["name"] for r in self.query("SELECT name FROM users WHERE shared = 1 ORDER BY name")]

    def remove_user(self, name: str) -> list[str]:
        """Delete the user and everything recorded for them; return their checkpoint directories
        (the caller deletes the files and unloads the adapter)."""
        with self.transaction() as conn:
            paths = [r["path"] for r in conn.execute("SELECT path FROM checkpoints WHERE user=?", (name,))]
            conn.execute("DELETE FROM turns WHERE user=?", (name,))  # judgments, votes, samples cascade
            conn.execute("DELETE FROM sessions WHERE user=?", (name,))
            conn.execute("DELETE FROM checkpoints WHERE user=?", (name,))
            conn.execute("DELETE FROM train_steps WHERE user=?", (name,))
            conn.execute("DELETE FROM preferences WHERE user=?", (name,))
            conn.execute("DELETE FROM users WHERE name=?", (name,))
        return paths
