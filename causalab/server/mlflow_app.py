"""MLflow's own server app, its page carrying the first-visit choices a causalab store wants.

MLflow 3.17's UI picks its GenAI or model-training navigation from the address's
``workflowType``, else from what the browser stored (``mlflow.workflowType_v1`` in its
localStorage, GenAI when nothing is stored); with its workflow-based navigation on, as 3.17
ships it, it reads no experiment tag for that (``mlflow.experimentKind`` only names the kind
the navigation implies). So an address pasted without ``workflowType`` (a point's run page,
any link MLflow's own pages make) opens GenAI pages in a new browser, and the assistant pane
opens over a quarter of the page on a first visit. The page MLflow serves for every address
(its ``index.html``, at ``/``; the UI routes after ``#``) carries here a script that runs
before MLflow's own: where the browser has stored no choice yet, it stores model training
and the assistant pane closed. A choice the user then makes in the UI is MLflow's to keep.

Registered with MLflow as app plugins (``mlflow.app`` entry points, ``pyproject.toml``):
``mlflow ui --app-name causalab`` (``causalab ui``, ``causalab server``) and
``--app-name causalab-auth``, MLflow's basic-auth app with the same page
(``causalab server --auth``). Which browser keys MLflow's bundle reads is checked against the
pinned MLflow by ``tests/platform/test_mlflow_app.py``.
"""
from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

APP = "causalab"
AUTH_APP = "causalab-auth"
# localStorage keys of MLflow 3.17's UI (its ``useLocalStorage`` stores ``<key>_v<version>``
# as JSON) and the value a first visit gets.
FIRST_VISIT = {"mlflow.workflowType_v1": "machine_learning",
               "mlflow.assistant.panelOpen_v1": False,
               "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True}
INDEX_ENDPOINT = "serve"  # the view MLflow's Flask app serves index.html from


def script() -> str:
    """The ``<script>`` that stores :data:`FIRST_VISIT`'s choices the browser has not made."""
    stored = json.dumps({key: json.dumps(value) for key, value in FIRST_VISIT.items()})
    return ("<script>(function(){try{var s=window.localStorage,d=" + stored + ";"
            "for(var k in d){if(s.getItem(k)===null){s.setItem(k,d[k]);}}}catch(e){}})();"
            "</script>")


def page(index: str) -> str:
    """MLflow's ``index.html`` with :func:`script` first in its head."""
    head = index.find("<head>")
    at = head + len("<head>") if head >= 0 else 0
    return index[:at] + script() + index[at:]


def install(flask_app) -> None:
    """Serve :func:`page` where MLflow's Flask app serves its ``index.html``."""
    from flask import Response

    original = flask_app.view_functions[INDEX_ENDPOINT]
    index = Path(flask_app.static_folder, "index.html")

    def serve():
        if not index.is_file():  # MLflow's own answer (a source install without its UI)
            return original()
        return Response(page(index.read_text(encoding="utf-8")), mimetype="text/html")

    flask_app.view_functions[INDEX_ENDPOINT] = serve


def create_app():
    """``mlflow ui --app-name causalab``: MLflow's server with :func:`page`."""
    from mlflow.server import app as flask_app
    from mlflow.server.fastapi_app import app as asgi_app

    install(flask_app)
    return asgi_app


def create_auth_app():
    """``mlflow server --app-name causalab-auth``: MLflow's basic-auth app with :func:`page`."""
    from mlflow.server import app as flask_app
    from mlflow.server.auth import create_app as auth_app

    install(flask_app)
    return auth_app(flask_app)


def registered(name: str = APP) -> bool:
    """Whether MLflow finds the app ``name`` (``make setup`` registers it with the package)."""
    return any(entry.name == name for entry in metadata.entry_points(group="mlflow.app"))


def app_arguments(auth: bool = False) -> tuple[str, ...]:
    """``--app-name`` for ``mlflow ui``/``server``: causalab's app where it is registered,
    else MLflow's own (``basic-auth``, or none), whose page stores nothing."""
    name = AUTH_APP if auth else APP
    if registered(name):
        return ("--app-name", name)
    return ("--app-name", "basic-auth") if auth else ()
