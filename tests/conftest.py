"""Suite-wide settings: no hub, no telemetry, quiet progress bars, a private model cache, and
none of the user's MLflow variables.

The model cache (``CAUSALAB_HOME``) is a temporary directory made for the session and removed at
its end, so the user's ``~/.cache/causalab`` is never written and subprocesses (CLI, Hydra jobs)
inherit the same cache. ``CAUSALAB_TEST_HOME`` opts into a lasting cache instead, so someone
iterating by hand dequantizes SmolLM2 once, not once per session. ``smollm2_dir`` is the one
place the suite materialises ``causalab:smollm2-135m`` (its first use dequantizes, 2-3 minutes),
``gemma3_dir`` the one place for ``causalab:gemma3-270m`` (its four chunks joined and
dequantized, about 2 minutes).
"""
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CAUSALAB_QUIET", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The user's own MLflow settings never reach a test: each test names the store it writes to
# (a test of the environment's precedence sets the variable itself, with monkeypatch).
for _name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_NAME",
              "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID", "MLFLOW_ARTIFACT_URI"):
    os.environ.pop(_name, None)

SMOLLM2 = "causalab:smollm2-135m"
GEMMA3 = "causalab:gemma3-270m"
_SESSION_HOME: list[str] = []


def pytest_configure(config):
    """Point ``CAUSALAB_HOME`` at ``CAUSALAB_TEST_HOME`` or at a fresh session directory."""
    chosen = os.environ.get("CAUSALAB_TEST_HOME")
    if not chosen:
        chosen = tempfile.mkdtemp(prefix="causalab-test-home-")
        _SESSION_HOME.append(chosen)
    os.makedirs(chosen, exist_ok=True)
    os.environ["CAUSALAB_HOME"] = chosen


def pytest_unconfigure(config):
    for home in _SESSION_HOME:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The dequantized SmolLM2-135M directory in the session cache (made on first use)."""
    from causalab.models import resolve

    return resolve(SMOLLM2).path


@pytest.fixture(scope="session")
def gemma3_dir() -> str:
    """The dequantized Gemma-3-270M directory in the session cache (made on first use)."""
    from causalab.models import resolve

    return resolve(GEMMA3).path
