"""A step's ``saves`` as plan ops, shared by every step kind's compiler."""

from __future__ import annotations

from causalab.compile.plan import SaveOp
from causalab.document.schema import Save
from causalab.files import TABLE_SUFFIX


def save_ops(saves: list[Save]) -> tuple[SaveOp, ...]:
    """``.json`` saves are metric tables; anything else is a tensor."""
    return tuple(SaveOp(value=s.value, file_path=s.file_path,
                        kind="table" if s.file_path.endswith(TABLE_SUFFIX) else "tensor")
                 for s in saves)
