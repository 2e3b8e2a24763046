"""``causalab server``: a team's tracking stack, PostgreSQL as MLflow's backend store with
``mlflow server`` in front of it, both listening on 127.0.0.1 and kept under one folder.

Under ``root``: ``pgdata/`` (the database cluster, made by ``initdb`` on first start),
``artifacts/`` (the artifact root the server proxies, 0700), ``server.json`` (ports, pids and
process groups of what runs), ``postgres.log`` and ``mlflow.log`` (0600), ``password`` (0600).
``mlflow server`` runs with umask 077, so what it writes (the artifacts it is sent, the
basic-auth app's ``basic_auth.db`` of password hashes) no other local user reads. It listens
on 127.0.0.1 unless told another address (``--host``), which it takes only with ``--auth`` in
front or ``--insecure`` said: an open server on a network lets anyone write and delete runs.

PostgreSQL is Debian's (``make setup`` installs the ``postgresql`` package), or any
``initdb``/``postgres`` on PATH or given as ``pg_bin``; it is started by ``pg_ctl -w`` (which
returns once it accepts connections) and looked at with ``pg_isready``. PostgreSQL refuses to run as root, so
when root starts the stack the database runs as a dedicated system user (``postgres``, which
the Debian package creates). Each server is started in its own process group and stopped by
that group: mlflow first (SIGTERM), then PostgreSQL with a fast shutdown (SIGINT), SIGKILL for
whatever outlives its grace period. The database accepts password logins from 127.0.0.1 only;
the password reaches ``mlflow server`` through its environment, never its command line.
Nothing here imports mlflow (it runs the ``mlflow`` command), so the CLI's offline verbs stay
light; psycopg2 is imported only to create the database.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from causalab.server import auth as server_auth, mlflow_app
from causalab.errors import TrackingError

STATE = "server.json"
DATABASE = "mlflow"
DB_USER = "mlflow"
DEFAULT_ROOT = ".causalab-server"
HOST = "127.0.0.1"


@dataclass
class Stack:
    """What one started stack is: where it lives and which process groups are its own."""

    root: str
    url: str
    store_uri: str  # without the password
    pg_port: int
    pg_pid: int
    mlflow_pid: int
    auth: bool = False  # MLflow's basic-auth app in front (server/auth.py)

    def save(self) -> None:
        (Path(self.root) / STATE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, root: str | Path) -> "Stack":
        path = Path(root) / STATE
        if not path.is_file():
            raise TrackingError(("server", "root"), f"no server started under {root} "
                                f"({STATE} missing)")
        return cls(**json.loads(path.read_text()))


# --- PostgreSQL ---------------------------------------------------------------------------

def pg_bin(explicit: str | None = None) -> Path:
    """The folder of ``initdb`` and ``postgres``: ``explicit``, PATH, else Debian's newest."""
    if explicit:
        folder = Path(explicit)
    elif shutil.which("initdb") and shutil.which("postgres"):
        folder = Path(shutil.which("postgres")).resolve().parent
    else:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                       key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
        folder = found[-1].parent if found else Path("/nonexistent")
    if not (folder / "initdb").is_file() or not (folder / "postgres").is_file():
        raise TrackingError(("server", "pg_bin"), "no PostgreSQL server binaries found "
                            f"(looked in {folder}); `make setup` installs Debian's postgresql, "
                            "or pass --pg-bin DIR")
    return folder


def _account(user: str | None) -> tuple[int, int] | None:
    """(uid, gid) PostgreSQL runs as: ``user`` when root starts it, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    import pwd

    name = user or "postgres"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise TrackingError(("server", "pg_user"), f"PostgreSQL refuses to run as root and "
                            f"there is no user {name!r} to run it as; `make setup` installs "
                            "Debian's postgresql, which creates 'postgres'") from None
    return entry.pw_uid, entry.pw_gid


def _as(account: tuple[int, int] | None) -> dict:
    return {} if account is None else {"user": account[0], "group": account[1],
                                       "extra_groups": []}


def _reachable(path: Path, account: tuple[int, int] | None) -> None:
    """Refuse a data folder the database's user could not reach (a 0700 parent of root's)."""
    if account is None:
        return
    for parent in path.resolve().parents:
        if not parent.stat().st_mode & 0o001:
            raise TrackingError(("server", "root"), f"{parent} is not searchable by the "
                                "database's user (uid %d): choose a --root outside it, or "
                                "chmod o+x it" % account[0])


def _password(root: Path) -> str:
    path = root / "password"
    if not path.is_file():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(24))
    return path.read_text().strip()


def init_cluster(root: Path, binaries: Path, account: tuple[int, int] | None) -> Path:
    """``pgdata/`` under ``root``, made by ``initdb`` the first time (owner: the database user)."""
    data = root / "pgdata"
    if (data / "PG_VERSION").is_file():
        return data
    _reachable(root, account)
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, pwfile = tempfile.mkstemp(prefix="causalab-pw-")
    try:
        os.write(handle, _password(root).encode())
        if account is not None:
            os.chown(data, *account)
            os.fchown(handle, *account)
        os.close(handle)
        done = subprocess.run(
            [str(binaries / "initdb"), "-D", str(data), "-U", DB_USER, f"--pwfile={pwfile}",
             "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "-E", "UTF8",
             "--locale=C"], capture_output=True, text=True, **_as(account))
    finally:
        os.unlink(pwfile)
    if done.returncode != 0:
        shutil.rmtree(data, ignore_errors=True)
        last = (done.stderr.strip().splitlines() or ["initdb failed"])[-1]
        raise TrackingError(("server", "initdb"), last)
    return data


def _start_postgres(root: Path, binaries: Path, account, port: int, timeout: float) -> int:
    """Start PostgreSQL with ``pg_ctl -w`` (it returns once the server accepts connections,
    or fails saying why); the postmaster's pid, which leads a session and group of its own."""
    data = init_cluster(root, binaries, account)
    # No Unix socket: TCP on loopback only, and nothing written outside the root.
    options = f"-p {port} -c listen_addresses={HOST} -c unix_socket_directories=''"
    log = _private_log(root / "postgres.log")
    try:
        done = subprocess.run(
            [str(binaries / "pg_ctl"), "start", "-D", str(data), "-w", "-t",
             str(max(1, int(timeout))), "-o", options], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=str(data), **_as(account))
    finally:
        os.close(log)
    try:  # the first line of postmaster.pid
        pid = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        pid = None
    if done.returncode != 0 or pid is None:
        tail = (root / "postgres.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise TrackingError(("server", "postgres"), "PostgreSQL did not start: "
                            + " | ".join(tail))
    return pid


def _ensure_database(port: int, password: str) -> None:
    """Create MLflow's database once (PostgreSQL already accepts connections)."""
    import psycopg2

    try:
        connection = psycopg2.connect(host=HOST, port=port, user=DB_USER, password=password,
                                      dbname="postgres", connect_timeout=10)
    except psycopg2.OperationalError as error:
        raise TrackingError(("server", "postgres"),
                            f"PostgreSQL does not answer: {error}".strip()) from None
    try:
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute("select 1 from pg_database where datname = %s", (DATABASE,))
            if cursor.fetchone() is None:
                cursor.execute(f"create database {DATABASE}")
    finally:
        connection.close()


def pg_ready(port: int) -> bool:
    """Whether PostgreSQL on ``port`` accepts connections (``pg_isready``)."""
    try:
        command = [str(pg_bin() / "pg_isready"), "-q", "-h", HOST, "-p", str(port), "-t", "2"]
    except TrackingError:
        return False
    return subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True).returncode == 0


# --- mlflow server ------------------------------------------------------------------------

def _private_log(path: Path) -> int:
    """``path`` opened to append, made 0600 (and made so when an earlier start left it 0644)."""
    handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(handle, 0o600)
    return handle


def _start_mlflow(root: Path, store_uri: str, port: int, host: str,
                  auth: bool = False) -> subprocess.Popen:
    mlflow = Path(sys.executable).parent / "mlflow"
    artifacts = root / "artifacts"
    artifacts.mkdir(mode=0o700, exist_ok=True)
    artifacts.chmod(0o700)  # made 0755 by an earlier version: no other user walks into it
    users = root / server_auth.USERS_DATABASE
    if users.is_file():
        users.chmod(0o600)
    # Without job execution the server starts no huey consumers: fewer processes, and
    # SIGTERM stops it in about a second.
    env = dict(os.environ, MLFLOW_BACKEND_STORE_URI=store_uri,
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_DISABLE_TELEMETRY="true")
    env.pop("MLFLOW_TRACKING_URI", None)
    if auth:
        env.update(server_auth.server_environment(root))
    log = _private_log(root / "mlflow.log")
    try:
        return subprocess.Popen(
            [str(mlflow), "server", "--host", host, "--port", str(port), "--workers", "1",
             "--artifacts-destination", str(artifacts), *mlflow_app.app_arguments(auth)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env, cwd=str(root), umask=0o077)
    finally:
        os.close(log)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def start(root: str | Path = DEFAULT_ROOT, *, port: int = 5000, pg_port: int = 0,
          host: str = HOST, pg_user: str | None = None, pg_binaries: str | None = None,
          timeout: float = 180.0, auth: bool = False, insecure: bool = False) -> Stack:
    """Start PostgreSQL, then ``mlflow server`` on it; returns once the server answers.
    A ``host`` other than loopback needs ``auth`` or ``insecure``
    (:func:`causalab.server.auth.check_host`).

    >>> stack = start("/srv/causalab-server", port=5000)  # doctest: +SKIP
    >>> stop(stack.root)                                  # doctest: +SKIP
    """
    server_auth.check_host(host, auth, insecure)
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if (root / STATE).is_file() and _running(Stack.load(root)):
        raise TrackingError(("server", "root"), f"a server already runs from {root}: "
                            f"`causalab server stop --root {root}` first")
    binaries, account = pg_bin(pg_binaries), _account(pg_user)
    pg_port = pg_port or free_port()
    deadline = time.monotonic() + timeout
    postgres = _start_postgres(root, binaries, account, pg_port, timeout)
    stack = Stack(str(root), f"http://{host}:{port}",
                  f"postgresql://{DB_USER}@{HOST}:{pg_port}/{DATABASE}", pg_port,
                  postgres, 0, auth)
    stack.save()
    try:
        _ensure_database(pg_port, _password(root))
        secret = f"postgresql+psycopg2://{DB_USER}:{_password(root)}@{HOST}:{pg_port}/{DATABASE}"
        server = _start_mlflow(root, secret, port, host, auth)
        stack.mlflow_pid = server.pid
        stack.save()
        _wait_for(stack.url, server, deadline, root)
    except BaseException:
        stop(root)
        raise
    return stack


def _wait_for(url: str, server: subprocess.Popen, deadline: float, root: Path) -> None:
    while not answers(url):
        if server.poll() is not None or time.monotonic() > deadline:
            tail = (root / "mlflow.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise TrackingError(("server", "mlflow"), f"mlflow server did not answer at {url}: "
                                + " | ".join(tail))
        time.sleep(0.5)


# --- stopping -----------------------------------------------------------------------------

def group_alive(group: int) -> bool:
    """Whether any process of ``group`` is still running (zombies do not count)."""
    import psutil

    if group <= 0:
        return False
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == group and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def stop_group(group: int, first: int, grace: float, leader_only: bool = False) -> None:
    """Send ``first`` (to the leader, or the whole group), then SIGKILL the group after
    ``grace`` seconds if any of it is left."""
    if not group_alive(group):
        return
    with contextlib.suppress(ProcessLookupError):
        (os.kill if leader_only else os.killpg)(group, first)
    deadline = time.monotonic() + grace
    while group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        if group_alive(group):
            os.killpg(group, signal.SIGKILL)
    while group_alive(group):
        time.sleep(0.1)


def stop(root: str | Path = DEFAULT_ROOT) -> Stack:
    """Stop mlflow (SIGTERM to its group), then PostgreSQL (fast shutdown, SIGINT)."""
    stack = Stack.load(Path(root).resolve())
    stop_group(stack.mlflow_pid, signal.SIGTERM, 15.0)
    # SIGINT to the postmaster alone: it ends its own children, then the group is checked.
    stop_group(stack.pg_pid, signal.SIGINT, 30.0, leader_only=True)
    return stack


def _running(stack: Stack) -> bool:
    return group_alive(stack.pg_pid) or group_alive(stack.mlflow_pid)


def status(root: str | Path = DEFAULT_ROOT) -> dict:
    stack = Stack.load(Path(root).resolve())
    return {**asdict(stack), "postgres": group_alive(stack.pg_pid) and pg_ready(stack.pg_port),
            "mlflow": group_alive(stack.mlflow_pid), "answers": answers(stack.url)}


def serve(root: str | Path = DEFAULT_ROOT, **options) -> Stack:
    """Start the stack, wait for Ctrl-C or SIGTERM (or either server to die), stop it."""
    stack = start(root, **options)
    login = f"; {server_auth.login_hint(Path(stack.root))}" if stack.auth else ""
    print(f"tracking server {stack.url} (backend {stack.store_uri}, artifacts "
          f"{Path(stack.root) / 'artifacts'}){login}; Ctrl-C stops it", flush=True)
    stopping = []
    # Both by hand: a shell starts a background job with SIGINT ignored, and Python then
    # raises no KeyboardInterrupt.
    previous = {number: signal.signal(number, lambda *_: stopping.append(True))
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stopping and group_alive(stack.pg_pid) and group_alive(stack.mlflow_pid):
            time.sleep(0.5)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        stop(stack.root)
    return stack


# --- the verb -----------------------------------------------------------------------------

def add_arguments(parser) -> None:
    """``causalab server {run,start,stop,status}`` and its options."""
    parser.add_argument("action", choices=("run", "start", "stop", "status"),
                        help="run: start both, stop both on Ctrl-C; start/stop: in the background")
    parser.add_argument("--root", default=DEFAULT_ROOT,
                        help=f"folder of the database, artifacts and logs (default {DEFAULT_ROOT})")
    parser.add_argument("--port", type=int, default=5000, help="mlflow server port (5000)")
    parser.add_argument("--host", default=HOST, help=f"mlflow server address ({HOST})")
    parser.add_argument("--pg-port", type=int, default=0, help="PostgreSQL port (0: a free one)")
    parser.add_argument("--pg-user", default=None,
                        help="system user PostgreSQL runs as when started by root (postgres)")
    parser.add_argument("--pg-bin", default=None, help="folder of initdb and postgres")
    parser.add_argument("--auth", action="store_true",
                        help="MLflow's basic-auth app in front: every request logs in "
                             "(admin password in <root>/admin_password, 0600)")
    parser.add_argument("--insecure", action="store_true",
                        help="serve a --host other than loopback without --auth (anyone who "
                             "reaches it can write and delete runs)")


def verb(args) -> dict:
    """Start, stop or look at the tracking stack (PostgreSQL + mlflow server)."""
    options = {"port": args.port, "host": args.host, "pg_port": args.pg_port,
               "pg_user": args.pg_user, "pg_binaries": args.pg_bin, "auth": args.auth,
               "insecure": args.insecure}
    if args.action == "status":
        found = status(args.root)
        said = f"(postgres {found['postgres']}, mlflow {found['mlflow']})"
        if not (found["answers"] and found["postgres"] and found["mlflow"]):
            raise TrackingError(("server", "status"), f"{found['url']} not answering {said}")
        return {**found, "text": f"{found['url']} running {said}"}
    if args.action == "stop":
        stack = stop(args.root)
        return {**asdict(stack), "text": f"stopped {stack.url} and its PostgreSQL"}
    stack = (serve if args.action == "run" else start)(args.root, **options)
    text = stack.url if args.action == "start" else f"stopped {stack.url} and its PostgreSQL"
    if args.action == "start" and stack.auth:
        text += f" ({server_auth.login_hint(Path(stack.root))})"
    return {**asdict(stack), "text": text}
