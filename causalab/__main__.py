"""``python -m causalab``: the same program as the ``causalab`` command (see causalab.cli.main).
Run by a Python without causalab's set-up, it says so in one line naming ``make setup``."""
try:
    from causalab.cli.main import console
except ModuleNotFoundError as missing:  # pydantic, torch, … not installed for this Python
    from causalab.errors import not_set_up

    line = not_set_up(missing, "causalab")
    if line is None:
        raise
    raise SystemExit(line) from None

if __name__ == "__main__":
    console()
