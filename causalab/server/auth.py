"""``causalab server --auth``: MLflow's own basic-auth app in front of the team store.

Under the stack's root, beside the database's ``password``: ``admin_password`` (0600, made
once with :mod:`secrets`), ``basic_auth.ini`` (MLflow's auth config: its user database
``basic_auth.db`` under the root, ``admin`` as the admin user, no permission by default) and
``basic_auth.db`` (the password hashes: 0600, as the server writes everything under umask
077), and ``flask_secret`` (0600, the key its forms are signed with). The admin
password reaches ``mlflow server`` through its environment
(``MLFLOW_AUTH_ADMIN_PASSWORD``, read once, when the auth app creates its admin), never its
command line or the ini. Clients authenticate as MLflow's client does: ``MLFLOW_TRACKING_USERNAME``
and ``MLFLOW_TRACKING_PASSWORD`` in the environment; :func:`credentials` reads them from the
file. A server that listens beyond loopback must have the login in front (or be told
``--insecure``: :func:`check_host`). Nothing here imports mlflow.
"""
from __future__ import annotations

import ipaddress
import secrets
from pathlib import Path

from causalab.errors import TrackingError

ADMIN = "admin"
PASSWORD_FILE = "admin_password"
CONFIG_FILE = "basic_auth.ini"
USERS_DATABASE = "basic_auth.db"
SESSION_KEY_FILE = "flask_secret"


def _secret(path: Path) -> str:
    """A random secret, made once into a 0600 file."""
    if not path.is_file():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(24))
    return path.read_text().strip()


def admin_password(root: Path) -> str:
    """The admin's password, in a 0600 file beside the database's."""
    return _secret(root / PASSWORD_FILE)


def server_environment(root: Path) -> dict[str, str]:
    """What ``mlflow server --app-name basic-auth`` needs: its config and the admin's password."""
    config = root / CONFIG_FILE
    if not config.is_file():
        config.touch(mode=0o600)
        config.write_text("[mlflow]\n"
                          "default_permission = NO_PERMISSIONS\n"
                          f"database_uri = sqlite:///{root / USERS_DATABASE}\n"
                          f"admin_username = {ADMIN}\n"
                          "authorization_function = "
                          "mlflow.server.auth:authenticate_request_basic_auth\n")
    return {"MLFLOW_AUTH_CONFIG_PATH": str(config),
            "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password(root),
            # The auth app's forms are signed with it (CSRF); one per stack, kept across starts.
            "MLFLOW_FLASK_SERVER_SECRET_KEY": _secret(root / SESSION_KEY_FILE)}


def credentials(root: Path) -> dict[str, str]:
    """The environment a causalab run (or any MLflow client) needs to write as the admin.

    >>> credentials(Path("/srv/causalab-server"))  # doctest: +SKIP
    {'MLFLOW_TRACKING_USERNAME': 'admin', 'MLFLOW_TRACKING_PASSWORD': '…'}
    """
    return {"MLFLOW_TRACKING_USERNAME": ADMIN,
            "MLFLOW_TRACKING_PASSWORD": (root / PASSWORD_FILE).read_text().strip()}


def login_hint(root: Path) -> str:
    """How a user of the printed tracking URI logs in, without printing the password."""
    return (f"login {ADMIN}, password in {root / PASSWORD_FILE}: export "
            f"MLFLOW_TRACKING_USERNAME={ADMIN} "
            f"MLFLOW_TRACKING_PASSWORD=$(cat {root / PASSWORD_FILE})")


def loopback(host: str) -> bool:
    """Whether ``host`` is this machine alone: ``localhost`` or a loopback address.

    >>> [loopback(h) for h in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "10.0.0.5")]
    [True, True, True, False, False]
    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def check_host(host: str, auth: bool, insecure: bool = False) -> None:
    """Refuse a server reachable from other machines without a login in front of it."""
    if loopback(host) or auth or insecure:
        return
    raise TrackingError(("--host",), f"{host} is reachable from other machines, and without "
                        "--auth anyone there could write and delete runs: add --auth (every "
                        "request logs in), or --insecure to serve it open anyway")
