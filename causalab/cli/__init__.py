"""The ``causalab`` command: its parser and error boundary (``main``), its verbs by what they touch."""
from causalab.cli.main import console, main  # noqa: F401  (the entry point)
