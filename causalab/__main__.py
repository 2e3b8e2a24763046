"""``python -m causalab``: the same program as the ``causalab`` command (see causalab.cli.main)."""
from causalab.cli.main import console

if __name__ == "__main__":
    console()
