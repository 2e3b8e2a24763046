"""``python -m causalab``: the same program as the ``causalab`` command (see causalab.cli)."""
from causalab.cli import console

if __name__ == "__main__":
    console()
