"""The document room: schema, vocabularies, sweep lowering, validation and digest.

Imports pydantic and the standard library only — never torch, transformers, nnsight,
mlflow or hydra — so ``vocab``, ``schema`` and ``validate`` run with nothing installed
beyond pydantic. Knows no checkpoint, tokenizer or data table.
"""
from causalab.document.check import naming_warnings, translate, validate, validate_point
from causalab.document.digest import digest
from causalab.document.export import json_schema, point_schema
from causalab.document.load import load_json
from causalab.document.schema import Document
from causalab.document.sweep import Point, lower

__all__ = ["Document", "Point", "digest", "json_schema", "load_json", "lower", "naming_warnings",
           "point_schema", "translate", "validate", "validate_point"]
