"""Where causalab reaches past MLflow's client, and the MLflow it was checked against.

docs/platform.md §5 ("Where MLflow has no public way") names three places; each test here
fails when the pinned MLflow changes what it relies on. A new SQLite store made in one
transaction from MLflow's own migration scripts and initial tables has the tables, columns,
indexes and revision MLflow's own client makes, and MLflow opens it; MLflow's own first use is
still its initial tables then its migrations through an env.py that configures alembic as
causalab's does. A moved store's rebase writes the ORM columns MLflow reads artifact locations
from. MLflow's client takes no timeout and reads its HTTP settings from the environment at each
request, so causalab sets them there for its own calls alone and puts them back. And
``causalab/`` calls no private MLflow function and runs no SQL of its own on MLflow's tables.
"""
from __future__ import annotations

import inspect
import os
import re
import subprocess
from pathlib import Path

import mlflow
import pytest

from causalab.tracking import reach, sqlite_store

REPO = Path(__file__).resolve().parents[2]
MIGRATIONS = Path(mlflow.store.__file__).parent / "db_migrations"


def test_the_pinned_mlflow_is_the_one_these_seams_were_checked_against():
    pinned = re.search(r"^mlflow==(\S+)$", (REPO / "requirements.txt").read_text(), re.M)
    assert pinned and pinned.group(1) == mlflow.__version__ == "3.17.2", (
        "a new MLflow: check each seam of docs/platform.md §5 against it, then this version")


def _schema(database: Path) -> dict:
    """Every table's columns (name, type, nullable, default), primary key, foreign keys and
    indexes, and the alembic revision: what MLflow's own migrations make, order aside."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(f"sqlite:///{database}")
    try:
        found = sqlalchemy.inspect(engine)
        tables = {}
        for name in found.get_table_names():
            tables[name] = {
                "columns": sorted((c["name"], str(c["type"]), c["nullable"], str(c["default"]))
                                  for c in found.get_columns(name)),
                "key": sorted(found.get_pk_constraint(name)["constrained_columns"]),
                "foreign": sorted((tuple(f["constrained_columns"]), f["referred_table"])
                                  for f in found.get_foreign_keys(name)),
                "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]))
                                  for i in found.get_indexes(name))}
        with engine.connect() as connection:
            revision = connection.exec_driver_sql(
                "select version_num from alembic_version").fetchall()
    finally:
        engine.dispose()
    return {"tables": tables, "revision": revision}


def test_a_store_made_in_one_transaction_is_the_store_mlflows_own_client_makes(tmp_path):
    from mlflow import MlflowClient
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    ours, theirs = tmp_path / "ours" / "mlflow.db", tmp_path / "theirs" / "mlflow.db"
    sqlite_store.make(f"sqlite:///{ours}", ours)
    theirs.parent.mkdir()
    MlflowClient(f"sqlite:///{theirs}").search_experiments()
    made, expected = _schema(ours), _schema(theirs)
    assert set(made["tables"]) == set(expected["tables"])
    for name, table in expected["tables"].items():
        assert made["tables"][name] == table, name
    assert made["revision"] == expected["revision"]
    SqlAlchemyStore(f"sqlite:///{ours}", str(tmp_path / "art"))  # MLflow checks its revision


def test_mlflows_own_first_use_is_its_initial_tables_then_alembic_as_causalab_runs_it():
    from mlflow.store.db import utils

    initialize = inspect.getsource(utils._initialize_tables)  # read, never called
    assert "InitialBase.metadata.create_all(engine)" in initialize
    assert "_upgrade_db(engine)" in initialize
    assert "from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase" \
        in inspect.getsource(utils)
    env = (MIGRATIONS / "env.py").read_text()
    configured = re.findall(r"context\.configure\((.*?)\)\n", env, re.S)
    assert [" ".join(c.split()) for c in configured] == [
        "url=url, target_metadata=target_metadata, literal_binds=True, render_as_batch=True",
        "connection=connection, target_metadata=target_metadata, render_as_batch=True"]
    assert "target_metadata = Base.metadata" in env
    assert "target_metadata=Base.metadata, render_as_batch=True" in sqlite_store._ENV
    assert "out-of-date database schema" in inspect.getsource(utils._verify_schema)


def test_the_rebase_writes_the_columns_mlflow_reads_artifact_locations_from(tmp_path):
    from mlflow import MlflowClient
    from mlflow.store.tracking.dbmodels import models

    assert {"artifact_location", "experiment_id"} <= set(models.SqlExperiment.__table__.c.keys())
    assert {"artifact_uri", "experiment_id"} <= set(models.SqlRun.__table__.c.keys())
    assert {"key", "value", "experiment_id"} <= set(models.SqlExperimentTag.__table__.c.keys())
    was, here = tmp_path / "was", tmp_path / "here"
    database = here / "mlflow.db"
    uri = f"sqlite:///{database}"
    sqlite_store.make(uri, database)
    client = MlflowClient(uri)
    old = (was / sqlite_store.ARTIFACTS).as_uri()
    experiment = client.create_experiment("moved", artifact_location=old,
                                          tags={sqlite_store.ROOT_TAG: str(was)})
    run = client.create_run(experiment).info.run_id
    assert sqlite_store.moved(client, database) == [(experiment, str(was))]
    sqlite_store.rebase(uri, database, sqlite_store.moved(client, database))
    new = (here / sqlite_store.ARTIFACTS).as_uri()
    assert client.get_experiment(experiment).artifact_location == new
    assert client.get_run(run).info.artifact_uri == f"{new}/{run}/artifacts"
    assert sqlite_store.moved(client, database) == []


def test_mlflow_takes_no_timeout_but_reads_its_http_settings_at_each_request():
    from mlflow import MlflowClient
    from mlflow.utils import rest_utils

    assert list(inspect.signature(MlflowClient.__init__).parameters) == [
        "self", "tracking_uri", "registry_uri", "workspace_store_uri"]
    request = inspect.getsource(rest_utils.http_request)
    for name in reach.DEADLINES:
        assert f"{name}.get()" in request, name


def test_causalab_calls_carry_the_deadlines_and_leave_the_environment_as_it_was(
        tmp_path, monkeypatch):
    for name in reach.DEADLINES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "99")  # the user's own: left alone
    before = dict(os.environ)

    class Reads:
        def settings(self):
            return {name: os.environ.get(name) for name in reach.DEADLINES}

    seen = reach.Bounded(Reads()).settings()
    assert seen == {**reach.DEADLINES, "MLFLOW_HTTP_REQUEST_TIMEOUT": "99"}
    assert dict(os.environ) == before
    client = reach.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.search_experiments()
    assert dict(os.environ) == before


def test_causalab_calls_no_private_mlflow_function_and_writes_no_sql_on_its_tables():
    found = subprocess.run(
        ["grep", "-rnE", r"mlflow\.[a-z_.]*\._|UPDATE (runs|experiments)|import _|"
                         r"_tracking_service|_engine_map|_initialize_tables|_upgrade_db",
         "causalab/"], cwd=REPO, capture_output=True, text=True)
    hits = [line for line in found.stdout.splitlines() if "mlflow" in line.lower()
            or "UPDATE" in line]
    assert hits == [], hits
