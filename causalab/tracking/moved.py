"""A SQLite store causalab made can be moved or copied as a folder and keep its artifacts.

MLflow keeps every artifact location absolute (``file:///old/place/mlartifacts/…``): on the
experiment and again on each run, both resolved when written. So the experiment of a store
causalab creates carries ``causalab.store_root``, the folder its ``mlflow.db`` was made in.
Whenever causalab opens the store and finds it in another folder (moved, or a copy), it
rewrites both columns from the old ``mlartifacts`` to the one beside the database, in one
transaction, and records the new folder, so MLflow itself (its UI, ``download_artifacts``,
``runs:/`` URIs) reads and writes the files where they now are. A copy is rebased on its own
database only; the original keeps its own. Stores causalab did not make, servers and other
databases are never touched. Plain ``sqlite3``: this runs before MLflow opens the store.
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
