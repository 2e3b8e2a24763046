"""The install works: nnterp imports against the pinned nnsight (STACK.md: 0.8 breaks it)."""
import importlib


def test_nnterp_imports_against_the_pinned_nnsight():
    nnsight = importlib.import_module("nnsight")
    nnterp = importlib.import_module("nnterp")
    assert nnsight.__version__ == "0.7.0"
    assert hasattr(nnterp, "StandardizedTransformer")
