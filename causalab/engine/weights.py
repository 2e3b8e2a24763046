"""Loading a checkpoint onto nnterp: frozen, in eval mode, once per process per placement.

It knows a model only as the plan's ``ModelRef`` (a local directory, a dtype, an attention
implementation); resolving keys and revisions is ``causalab.models``' job, done at compile.
It never traces: the walk does. Loading is quiet: transformers' progress bars are switched
off for the duration of the load and restored afterwards.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from causalab import memory
from causalab.compile.plan import ModelRef
from causalab.document import vocab
from causalab.engine.budget import Budget
from causalab.engine.state import ModelFacts
from causalab.errors import ModelError

# vocab.DTYPES spells each document dtype as torch names it ("torch.float32").
DTYPES = {name: getattr(torch, spelled.removeprefix("torch."))
          for name, spelled in vocab.DTYPES.items()}


def load_model(ref: ModelRef, device_map: str = "cpu"):
    """The checkpoint at ``ref.path`` as a frozen ``nnterp.StandardizedTransformer``.

    ``attn_implementation: "eager"`` also switches on attention probabilities. Weights are
    dispatched before they are frozen (a freeze applied to a lazy shell is lost when the real
    modules replace it, docs/format.md §18). The same (path, dtype, attention, placement) returns
    the same object for the rest of the process, so a document loads its model once.
    """
    if ref.dtype not in DTYPES:
        raise ModelError(("model", "dtype"), f"dtype {ref.dtype!r} is not one of {sorted(DTYPES)}")
    from causalab.memory import return_freed_memory
    from causalab.models import verify_weights

    verify_weights(ref.key, ref.path, ref.revision)  # compile read no weights; check them here
    return_freed_memory()
    return _load(ref.path, ref.dtype, ref.attn_implementation, placement(device_map),
                 getattr(ref, "control", None))


def placement(device_map: str) -> str:
    """``auto`` means the accelerator when there is one and ``cpu`` otherwise: accelerate's
    own ``auto`` misbehaves on machines without one (docs/format.md §18)."""
    if device_map == "auto" and not torch.cuda.is_available():
        return "cpu"
    return device_map


# How many models this process has loaded (not served from ``_load``'s cache): a budget
# measured before a load that then came from the cache already counts the weights.
_LOADS = [0]
# (path, dtype) of every model ``_load`` has loaded: their weights are in what the process holds.
_LOADED: set[tuple[str, str]] = set()


@functools.lru_cache(maxsize=4)
def _load(path: str, dtype: str, attn_implementation: str | None, device_map: str,
          control: str | None = None):
    from nnterp import StandardizedTransformer

    _LOADS[0] += 1
    _LOADED.add((path, dtype))
    from causalab.models import bars, load_config, load_tokenizer

    tokenizer = load_tokenizer(path)
    kwargs = _attention_kwargs(load_config(path), attn_implementation)
    try:
        with bars.quiet():
            model = StandardizedTransformer(
                path, tokenizer=tokenizer, device_map=device_map, dtype=DTYPES[dtype],
                dispatch=True, **kwargs)
    except (OSError, ValueError, RuntimeError) as error:
        raise ModelError(("model", "key"), f"cannot load {path}: {error}") from None
    if control == "random_init":
        _TWINS[(path, control)] = _random_init(model, RANDOM_INIT_SEED)
    model._model.eval()
    model._model.requires_grad_(False)
    if dtype != "fp32":
        model._model.get_output_embeddings().register_forward_pre_hook(_contiguous)
    return model


RANDOM_INIT_SEED = vocab.MODEL_CONTROLS["random_init"]["seed"]
# (checkpoint directory, control) -> the twin's own revision: the tensor digest of the weights
# that replaced the checkpoint's, computed where they are made.
_TWINS: dict[tuple[str, str], str] = {}


def twin_revision(ref: ModelRef | None) -> str | None:
    """The revision of the control this process loaded for ``ref`` (None: no control)."""
    control = getattr(ref, "control", None)
    return _TWINS.get((ref.path, control)) if control else None


def _random_init(model, seed: int) -> str:
    """The checkpoint's architecture with fresh weights: transformers' own initialisation of
    a model built from the same config under ``torch.manual_seed(seed)``, copied in. Returns
    the fresh weights' tensor digest, the twin's own revision."""
    from transformers import AutoModelForCausalLM

    from causalab.models.revision import tensor_digest

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = AutoModelForCausalLM.from_config(model._model.config)
    weights = fresh.state_dict()
    with torch.no_grad():
        model._model.load_state_dict(weights)
    return tensor_digest(weights)


def _contiguous(module, args):
    """The head's input made contiguous in half precision: over the last column alone it is
    a strided slice ``(rows, 1, d)``, which the CPU's bf16 matmul copies the weight into once
    per row to multiply (12.6 GB for 24 rows of a 128,256-word head at d=2048)."""
    return (args[0].contiguous(), *args[1:])


def _attention_kwargs(config, attn_implementation: str | None) -> dict:
    """nnterp's arguments for the attention implementation the document pins.

    Eager turns on attention-probability access; GPT-2's probabilities sit at the default
    source (STACK.md), not where nnterp's GPT-2 table looks for them.
    """
    if attn_implementation != "eager":
        return {"attn_implementation": attn_implementation} if attn_implementation else {}
    kwargs: dict = {"enable_attention_probs": True}
    if getattr(config, "model_type", None) == "gpt2":
        from nnterp.rename_utils import RenameConfig, default_attention_prob_source

        kwargs["rename_config"] = RenameConfig(attn_prob_source=default_attention_prob_source)
    return kwargs


def served_dtype(model) -> str:
    """The dtype of the unembedding weight the run actually used (``run.json``)."""
    return str(model._model.get_output_embeddings().weight.dtype)


class Measured(NamedTuple):
    """A run's memory budget in bytes (the whole process), what the process held before the
    model loaded, the weights' size in the run's dtype, where they land, and their dtype."""

    total: int
    before: int
    weights: int
    device: str
    dtype: str
    loads: int = 0  # ``_LOADS`` when measured
    margin: int = 0  # what the load and its smallest trace add beyond the weights

def device_of(device_map: str) -> str:
    """The device a placement's memory is counted on: the first accelerator, or the CPU."""
    where = placement(device_map)
    if where == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return where if memory.is_accelerator(where) else "cuda:0"


def measure_budget(ref: ModelRef, text: str | None, device_map: str = "cpu") -> Measured:
    """The budget ``text`` (None: ``memory.DEFAULT``) measured on this machine, refused before
    loading when it cannot hold the process's floor and the weights together (one line naming
    the floor, the weights and the budget, and the least budget that holds them)."""
    device = device_of(device_map)
    memory.import_runtime()  # the load imports it anyway: measured now, it is in the floor
    before = memory.used_bytes(device)
    total = memory.budget_bytes(text, device)
    weights = memory.weights_bytes(ref.path, ref.dtype)
    loaded = _is_loaded(ref)
    # A model an earlier run of this process loaded is in ``before`` already.
    runtime = max(before - (weights if loaded else 0), 0)
    floor = memory.floor_bytes(runtime, ref.path, device)
    # Loading in another dtype than stored maps the stored file beside the converted copy.
    stored = 0 if loaded or memory.is_accelerator(device) else \
        memory.converted_bytes(ref.path, ref.dtype)
    if floor + weights + stored > total:
        spelled = text or f"{memory.DEFAULT} of free memory"
        shown = f" ({spelled})" if "%" in spelled else ""
        mapped = f" (+ {memory.gib(stored)} stored, mapped as they convert)" if stored else ""
        raise ModelError(("model", "key"), f"{ref.key}: its weights take {memory.gib(weights)} "
                                           f"in {ref.dtype}{mapped} and the process's floor "
                                           f"{memory.gib(floor)} (its runtime "
                                           f"{memory.gib(runtime)} + the load and smallest trace "
                                           f"{memory.gib(floor - runtime)}), more than the "
                                           f"memory budget of {memory.gib(total)}{shown} "
                                           f"on {device}: give at least "
                                           f"{_at_least(floor + weights + stored)}")
    return Measured(total, before, weights, device, ref.dtype, _LOADS[0], floor - runtime)


def _is_loaded(ref: ModelRef) -> bool:
    """Whether this process loaded ``ref``'s weights already (``_load`` keeps them)."""
    return (ref.path, ref.dtype) in _LOADED


def _at_least(count: int) -> str:
    """A budget a user can type that holds ``count`` bytes, rounded up to 16 MiB (the
    runtime's resident set differs by a few MiB from one process to the next)."""
    step = 16 * 2 ** 20
    return f"{-(-count // step) * 16}MiB"


def budget_of(measured: Measured, model) -> Budget:
    """The budget the planner spends once ``model`` is in: what the process holds now, and at
    least its floor (before, plus what the load and the smallest trace add, plus, when it was
    loaded just now, the weights: a mapped file's pages are not all resident yet), so at the
    least budget accepted every trace runs one row. A model an earlier run of this process
    loaded was in ``before`` already."""
    held = max(memory.used_bytes(measured.device), measured.before + measured.margin)
    if _LOADS[0] != measured.loads:
        held = max(held, measured.before + measured.margin + measured.weights)
    return Budget(measured.total, held, memory.ITEMSIZE.get(measured.dtype, 4),
                  ModelFacts.of(model._model.config), measured.device)
