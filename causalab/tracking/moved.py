"""A SQLite store causalab made can be moved or copied as a folder and keep its artifacts.

MLflow keeps every artifact location absolute, so the experiment records the folder its store
was made in (``causalab.store_root``) and a store found elsewhere is rebased in one transaction
(docs/platform.md §5). Plain ``sqlite3``: this runs before MLflow opens the store.
"""
from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

ROOT_TAG = "causalab.store_root"
ARTIFACTS = "mlartifacts"


def rebase(database: Path) -> int:
    """Point a moved store's artifact locations at the ``mlartifacts`` beside ``database``;
    returns how many experiments were rebased (0: none moved, or not a store causalab made)."""
    here = str(database.resolve().parent)
    new = (Path(here) / ARTIFACTS).as_uri()
    with contextlib.closing(sqlite3.connect(database, timeout=30)) as db:
        try:
            moved = db.execute("SELECT experiment_id, value FROM experiment_tags WHERE key = ? "
                               "AND value != ?", (ROOT_TAG, here)).fetchall()
        except sqlite3.DatabaseError:  # no tables yet, or not a store: MLflow says what it is
            return 0
        with db:
            for experiment, was in moved:
                old = (Path(was) / ARTIFACTS).as_uri()
                for table, column in (("experiments", "artifact_location"),
                                      ("runs", "artifact_uri")):
                    db.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                               f"WHERE experiment_id = ? AND substr({column}, 1, ?) = ?",
                               (new, len(old) + 1, experiment, len(old), old))
                db.execute("UPDATE experiment_tags SET value = ? WHERE experiment_id = ? AND "
                           "key = ?", (here, experiment, ROOT_TAG))
    return len(moved)
