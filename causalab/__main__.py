"""``python -m causalab``: the same program as the ``causalab`` command (see causalab.cli)."""
from causalab.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
