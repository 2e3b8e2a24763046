"""Architecture is a test: the rooms, the one seam, plain-data plans, file sizes, no pickle.

Every check here parses the package's source; each one fails if it found nothing to check,
so an emptied package cannot pass by vacuity.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "causalab"

# room -> top-level modules it must never import (STYLE.md, "The shape")
FORBIDDEN = {
    "document": {"torch", "transformers", "nnsight", "nnterp", "mlflow", "hydra", "omegaconf",
                 "safetensors", "causalab.compile", "causalab.engine", "causalab.models",
                 "causalab.tracking"},
    "compile": {"nnsight", "nnterp", "mlflow", "hydra", "omegaconf", "causalab.engine",
                "causalab.tracking"},
    "engine": {"mlflow", "hydra", "omegaconf", "causalab.cli", "causalab.tracking",
               "causalab.hydra", "causalab.run", "causalab.plots", "causalab.server"},
    "models": {"mlflow", "hydra", "nnsight", "causalab.engine", "causalab.tracking",
               "causalab.cli"},
    # the rooms around the three: pictures from plain numbers, Hydra's side, the team server
    "plots": {"torch", "transformers", "nnsight", "nnterp", "mlflow", "hydra", "causalab.cli",
              "causalab.compile", "causalab.models", "causalab.tracking"},
    # results read back: a store only through tracking's client (tracking alone imports MLflow)
    "results": {"mlflow", "hydra", "omegaconf", "nnsight", "nnterp", "causalab.cli",
                "causalab.hydra", "causalab.server"},
    # a sweep's scores as plain numbers: read by tracking and plots, reading neither
    "scores": {"torch", "transformers", "nnsight", "nnterp", "mlflow", "hydra", "omegaconf",
               "causalab.compile", "causalab.engine", "causalab.models", "causalab.tracking",
               "causalab.plots", "causalab.cli", "causalab.hydra", "causalab.server"},
    "hydra": {"torch", "transformers", "nnsight", "nnterp", "causalab.engine", "causalab.cli"},
    "server": {"torch", "transformers", "nnsight", "nnterp", "causalab.engine",
               "causalab.compile", "causalab.document", "causalab.models"},
}
THREE_ROOMS_AND_MODELS = {"document", "compile", "engine", "models"}
# One concept at two or three stages keeps its name in each room (docs/README.md says which).
SAME_CONCEPT_AT_STAGES = {"attribution.py", "positions.py", "steps.py"}
# Files are cut by meaning, not by size: past SOFT_LINES a file is worth a second look (a warning
# in the test report), past HARD_LINES it is a room that lost its shape.
SOFT_LINES = 400
HARD_LINES = 1000
MAX_FUNCTION_LINES = 60
MAX_WALK_LINES = 300


def _sources() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    assert files, "no package source found"
    return files


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _room(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 and parts[0] in FORBIDDEN else None


def test_no_room_imports_what_its_row_forbids():
    checked = 0
    for path in _sources():
        room = _room(path)
        if room is None:
            continue
        checked += 1
        for name in _imports(ast.parse(path.read_text())):
            for banned in FORBIDDEN[room]:
                assert not (name == banned or name.startswith(banned + ".")), (
                    f"{path.relative_to(PACKAGE)} ({room}) imports {name}")
    assert checked > 10


def test_importing_the_document_room_leaves_torch_out():
    code = ("import sys, causalab.document, causalab.document.vocab; "
            "bad = [m for m in ('torch', 'transformers', 'nnsight', 'mlflow') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_nobody_writes_from_causalab_import_compile():
    offenders = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "causalab":
                if any(alias.name == "compile" for alias in node.names):
                    offenders.append(str(path))
    assert not offenders
    assert not (PACKAGE / "hydra.py").exists()


def test_plan_nodes_are_frozen_plain_data_without_behaviour():
    plan = importlib.import_module("causalab.compile.plan")
    nodes = [obj for obj in vars(plan).values()
             if isinstance(obj, type) and dataclasses.is_dataclass(obj)
             and obj.__module__ == plan.__name__]
    assert len(nodes) >= 10
    for node in nodes:
        assert node.__dataclass_params__.frozen, node.__name__
        assert not hasattr(node, "run") and not hasattr(node, "execute"), node.__name__


def _defs(name: str) -> list[Path]:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == name:
                found.append(path)
    return found


@pytest.mark.parametrize("name", ["gather", "apply_write", "scatter"])
def test_the_seam_is_defined_exactly_once(name):
    found = _defs(name)
    assert [p.relative_to(PACKAGE).as_posix() for p in found] == ["engine/seam.py"]


def test_only_the_seam_calls_scatter():
    callers = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == "scatter":
                    callers.add(path.relative_to(PACKAGE).as_posix())
    assert callers == {"engine/seam.py"}


def _trace_blocks() -> list[tuple[Path, ast.With]]:
    blocks = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.With):
                for item in node.items:
                    call = item.context_expr
                    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                            and call.func.attr in {"trace", "generate", "session"}):
                        blocks.append((path, node))
    return blocks


def test_only_the_walk_opens_a_tracing_context():
    blocks = _trace_blocks()
    assert blocks, "no tracing context found to check"
    assert {p.relative_to(PACKAGE).as_posix() for p, _ in blocks} == {"engine/runner.py"}


def test_no_trace_body_names_a_client_side_object():
    client_side = {"document", "tokenizer", "self", "plan", "raw"}
    blocks = _trace_blocks()
    assert blocks
    for path, block in blocks:
        for statement in block.body:
            for node in ast.walk(statement):
                if isinstance(node, ast.Name):
                    assert node.id not in client_side, f"{path.name}:{node.lineno} names {node.id}"


def test_every_file_stays_under_the_hard_line_limit_and_long_ones_are_named():
    sizes = {p.relative_to(PACKAGE).as_posix(): len(p.read_text().splitlines()) for p in _sources()}
    assert sizes
    for path, lines in sorted(sizes.items()):
        if lines > SOFT_LINES:
            warnings.warn(f"{path}: {lines} lines (over {SOFT_LINES}): still one meaning?")
    assert not {p: n for p, n in sizes.items() if n > HARD_LINES}


def test_no_two_files_share_a_name_unless_one_concept_at_stages():
    rooms: dict[str, list[str]] = {}
    for path in _sources():
        if path.name != "__init__.py":
            rooms.setdefault(path.name, []).append(path.relative_to(PACKAGE).as_posix())
    assert len(rooms) > 100
    shared = {name: where for name, where in rooms.items() if len(where) > 1}
    assert set(shared) <= SAME_CONCEPT_AT_STAGES, shared
    mapped = (PACKAGE.parent / "docs" / "README.md").read_text()
    for name, where in shared.items():
        assert all(f"`causalab/{w.rsplit('/', 1)[0]}/`" in mapped for w in where), name


def test_the_walk_stays_a_walk():
    walk = PACKAGE / "engine" / "walk.py"
    assert len(walk.read_text().splitlines()) <= MAX_WALK_LINES


def _engine_sources() -> list[Path]:
    files = [p for p in _sources() if _room(p) == "engine"]
    assert len(files) > 10
    return files


def test_no_engine_signature_takes_state_as_any():
    untyped = []
    for path in _engine_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
                for argument in arguments:
                    if (argument.arg == "state" and (argument.annotation is None or ast.unparse(
                            argument.annotation) in ("Any", "typing.Any"))):
                        untyped.append(f"{path.name}:{node.lineno} {node.name}")
    assert not untyped


def _tagged(node: ast.AST, components: set) -> bool:
    """A tuple whose first member is a string literal naming a kind, ``("read", name, role)``;
    ``("block_mid", layer)`` is an address (a vocabulary component and its layer), not a tag."""
    return (isinstance(node, ast.Tuple) and bool(node.elts)
            and isinstance(node.elts[0], ast.Constant) and isinstance(node.elts[0].value, str)
            and node.elts[0].value not in components)


def test_no_engine_dict_is_keyed_by_tagged_tuples():
    components = set(importlib.import_module("causalab.document.vocab").COMPONENTS)
    keyed, looked = [], 0
    for path in _engine_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            keys = []
            if isinstance(node, ast.Subscript):
                keys = [node.slice]
            elif isinstance(node, ast.Dict):
                keys = [key for key in node.keys if key is not None]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("get", "pop", "setdefault") and node.args):
                keys = node.args[:1]
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
                keys = [node.left]
            looked += len(keys)
            keyed += [f"{path.name}:{node.lineno}" for key in keys if _tagged(key, components)]
    assert looked > 100
    assert not keyed


def test_the_pipeline_uses_only_the_names_the_engine_room_offers():
    engine = importlib.import_module("causalab.engine")
    offered = set()
    for line in engine.__doc__.split("may use only:")[1].split("``"):
        if "." in line and " " not in line.strip():
            offered.add(line.strip())
    assert offered
    used = set()
    for path in _sources():
        if _room(path) in THREE_ROOMS_AND_MODELS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("causalab.engine."):
                module = node.module.removeprefix("causalab.engine.")
                used.update(f"{module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module == "causalab.engine":
                used.update(f"{alias.name}" for alias in node.names)
    assert used
    assert not {name for name in used if name not in offered and name not in {"record"}}


def test_every_function_stays_within_sixty_lines():
    lengths = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno} {node.name}"
                lengths[where] = node.end_lineno - node.lineno + 1
    assert lengths, "no function found to measure"
    assert not {where: n for where, n in lengths.items() if n > MAX_FUNCTION_LINES}


def test_nothing_pickles():
    hits = []
    for path in _sources():
        text = path.read_text()
        for needle in ("import pickle", "torch.save(", "torch.load(", "cloudpickle", "joblib.dump"):
            if needle in text:
                hits.append(f"{path.name}: {needle}")
    assert not hits


def test_engine_tables_have_the_vocabulary_keys():
    vocab = importlib.import_module("causalab.document.vocab")
    mechanisms = importlib.import_module("causalab.engine.mechanisms")
    metrics = importlib.import_module("causalab.engine.metrics")
    featurizers = importlib.import_module("causalab.engine.featurizers")
    assert set(mechanisms.MECHANISMS) == set(vocab.MECHANISMS)
    assert set(metrics.METRICS) == set(vocab.METRIC_KINDS)
    assert set(featurizers.FEATURIZERS) == set(vocab.FEATURIZER_KINDS) | {"identity"}


def test_the_engine_reaches_exactly_the_accessors_the_vocabulary_names():
    vocab = importlib.import_module("causalab.document.vocab")
    sites = importlib.import_module("causalab.engine.sites")
    named = {row["accessor"] for row in vocab.COMPONENTS.values()}
    named |= {row["accessor"] for row in vocab.EXTRA_ACCESSORS.values()}
    assert len(named) > 20
    assert set(sites.REACH) == named


def test_every_featurizer_kind_lives_in_its_own_module():
    featurizers = importlib.import_module("causalab.engine.featurizers")
    assert featurizers.FEATURIZERS
    for kind, cls in featurizers.FEATURIZERS.items():
        assert cls.__module__ == f"causalab.engine.featurizers.{kind}"


def test_only_the_runner_module_names_a_trace_call():
    called = {p.relative_to(PACKAGE).as_posix() for p in _engine_sources()
              if ".trace(" in p.read_text()}
    assert called == {"engine/runner.py"}


def test_no_engine_module_but_the_dry_runner_branches_on_a_dry_run():
    """A dry run is a runner (``dry_run.DryRunner``), not a branch: nothing else in the engine
    names its placeholder or asks whether a trace ran."""
    needles = ("PLANNED", "traced is None", "traced is not None", "model is None",
               "model is not None")
    hits = [f"{p.name}: {needle}" for p in _engine_sources() if p.name != "dry_run.py"
            for needle in needles if needle in p.read_text()]
    assert not hits


def test_the_pipeline_calls_one_engine_function_to_run():
    tree = ast.parse((PACKAGE / "pipeline.py").read_text())
    imported = {f"{node.module}.{alias.name}" for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "causalab.engine") for alias in node.names}
    assert imported - {"causalab.engine.events.Events", "causalab.engine.entry.points_of"} == {
        "causalab.engine.entry.run_document"}


def test_job_kinds_taps_and_heads_are_literals_of_their_tables():
    from typing import get_args

    jobs = importlib.import_module("causalab.engine.trace_jobs")
    assert set(get_args(jobs.JobKind)) == set(jobs.KINDS)
    assert set(get_args(jobs.TapKind)) == set(jobs.TAPS)
    assert set(get_args(jobs.Head)) == set(jobs.HEADS) == set(jobs.UNEMBED)
    assert set(get_args(jobs.StageKind)) == set(jobs.KINDS) | {"serve"}
    assert "live" not in {f.name for f in dataclasses.fields(jobs.TraceJob)}


def test_both_runners_answer_every_call_of_the_runner_protocol():
    runner = importlib.import_module("causalab.engine.runner")
    dry_run = importlib.import_module("causalab.engine.dry_run")
    calls = {name for name, value in vars(runner.Runner).items()
             if callable(value) and not name.startswith("_")}
    assert {"run", "at", "observe", "fit", "verify", "edges"} <= calls
    for implementation in (runner.TraceRunner, dry_run.DryRunner):
        assert all(callable(getattr(implementation, name, None)) for name in calls)
