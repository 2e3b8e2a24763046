"""The compile room: document + model config + tokenizer + rows -> a plan of plain data.

Never loads weights and never imports nnsight, nnterp, mlflow or hydra. Import it as
``import causalab.compile`` (``from causalab import compile`` would shadow the builtin).
"""
from causalab.compile.explain import explain, explain_payload, unchecked
from causalab.compile.point import compile_document, compile_point

__all__ = ["compile_document", "compile_point", "explain", "explain_payload", "unchecked"]
