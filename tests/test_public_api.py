"""The public namespace: every name in ``__all__`` resolves, and importing costs nothing."""
import subprocess
import sys

import causalab


def test_every_public_name_resolves_to_a_real_object():
    assert 10 <= len(causalab.__all__) <= 25
    for name in causalab.__all__:
        assert getattr(causalab, name) is not None, name


def test_importing_causalab_imports_no_torch_or_mlflow():
    code = ("import sys, causalab; "
            "bad = [m for m in ('torch', 'mlflow', 'nnsight', 'hydra') if m in sys.modules]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
