"""The ``causalab`` command: its parser and error boundary (``main``), its verbs by what they touch."""
from causalab.cli.main import console  # noqa: F401  (the entry point, pyproject.toml)
