"""Step bodies around a pass: featurizers built, outputs published, saves written, fits run.

The walk hands each step here after (or instead of) running its pass; this module never
opens a trace. Published values go into the plan's walk state (its outputs namespace);
files go through ``record`` (atomic writes) and ``bundles`` (stamps). Metric tables keep
every row of the step, excluded ones included (docs/format.md §13).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from causalab.compile.featurizers import save_stamp, where
from causalab.compile.plan import Featurizers, Fit, Observe, SaveOp, Weights
from causalab.engine import outputs as output_rules
from causalab.engine import containment, record
from causalab.engine.bundle_files import document_stamp, stamp_metadata, step_source, weights_results
from causalab.engine.assembly import PassResult, metric_rows
from causalab.engine.state import WalkState
from causalab.engine.step_sources import find_read, output_stamp
from causalab.errors import CausalabError, RunError
from causalab.files import SAELENS_CONFIG, SAELENS_WEIGHTS, TENSOR_KEY, TENSOR_SUFFIX
from causalab.uncertainty import interval

if TYPE_CHECKING:  # annotations only
    from nnterp import StandardizedTransformer

    from causalab.engine.runner import Runner


def build_featurizers(node: Featurizers, model: StandardizedTransformer, state: WalkState) -> None:
    """Live featurizer objects on the model's device, shared by the plan's later steps."""
    from causalab.engine.featurizers import build_featurizer

    device = model._model.get_input_embeddings().weight.device
    for spec in node.featurizers:
        state.specs[spec.name] = spec
        if step_source(spec.file_path) is not None:  # built once its step has run
            continue
        try:
            state.featurizers[spec.name] = build_featurizer(spec, device,
                                                            resolver=state.events.resolve)
        except CausalabError as error:  # a download refused at the bare "file_path"
            if error.path[:1] != ("file_path",):
                raise
            raise type(error)(("featurizers", spec.name) + error.path, error.message) from None
    node.results.update(featurizers=dict(state.featurizers))


def _publish(node: Observe, result: PassResult, state: WalkState) -> dict:
    published = {}
    for output in node.outputs:
        try:
            value = output_rules.reduce(result.reads[output.read], output,
                                        result.layouts[output.read])
        except RunError as error:
            raise RunError(("steps", node.name, "outputs") + error.path, error.message) from None
        published[output.name] = value
        state.published[output.name] = value
    return published


def step_label(step: str, state: WalkState) -> str:
    """The step as events name it: ``<step>/<intervention>`` inside a list entry's plan."""
    entry = state.entry
    return f"{step}/{entry}" if entry else step


def _report_metrics(result: PassResult, state: WalkState, step: str) -> None:
    for name, (values, eligible) in result.metrics.items():
        mean = float(values.detach().float().mean()) if len(eligible) else None
        state.events.metric(state.point, step, name, mean, len(eligible))
        bounds = interval(values.detach().double().cpu().numpy()) if len(eligible) else None
        if bounds is not None:
            state.events.interval(state.point, step, name, *bounds)


def _twin(metadata: dict, state: WalkState) -> dict:
    """A file's stamp with the twin's own revision beside its control (``model_control``),
    when the model is a control this process made."""
    from causalab.engine.weights import twin_revision

    revision = twin_revision(state.model_ref) if metadata.get("model_control") else None
    return {**metadata, "model_control_revision": revision} if revision else metadata


def _plain(name: str, produced: dict) -> str:
    """A save's value: exact, or the bare name of a qualified ``<intervention>/<value>``."""
    if name in produced:
        return name
    return name.rsplit("/", 1)[-1]


def finish_observe(node: Observe, result: PassResult, state: WalkState, directory: Path) -> list[str]:
    """Publish outputs, report metrics and write the step's saves (generated ids included)."""
    published = _publish(node, result, state)
    node.results.update(result, outputs=published)
    _report_metrics(result, state, step_label(node.name, state))
    written = []
    generated = result.generated
    for save in node.saves:
        name = _plain(save.value, {**result.metrics, **published, **generated})
        if name in result.metrics:
            rows = metric_rows(node.pass_, result, name, state.digest, name)
            written.append(record.write_json(directory / save.file_path, rows, root=directory))
        elif name in published:
            written += _save_output(node, published[name], name, save, state, directory)
        elif name in generated:
            stamp = _twin(save_stamp(name, {}, state.model_ref, state.digest), state)
            written.append(record.write_tensor(directory / save.file_path, generated[name],
                                               stamp, root=directory))
        else:
            raise RunError(("steps", node.name, "saves"), f"{save.value!r} is not produced here")
    return written


def _save_output(node: Observe, value: output_rules.Published, name: str, save: SaveOp,
                 state: WalkState, directory: Path) -> list[str]:
    if value.reduce in ("pca", "sae"):
        metadata = stamp_metadata(output_stamp(node, name, value, state),
                                  produced_by=state.digest)
    else:
        read = find_read(node.pass_, next(o for o in node.outputs if o.name == name).read)
        metadata = save_stamp(name, where(read.site, read.address), state.model_ref,
                              state.digest)
    metadata = _twin(metadata, state)
    if value.reduce == "sae":
        return _save_dictionary(node, name, value, save, metadata, directory)
    # A float read is saved as float32 (a bf16 model's reads too); ids stay integers.
    tensor = value.value.float() if value.value.is_floating_point() else value.value
    return [record.write_tensor(directory / save.file_path, tensor, metadata, root=directory)]


def _save_dictionary(node: Observe, name: str, value: output_rules.Published, save: SaveOp,
                     metadata: dict, directory: Path) -> list[str]:
    """A harvested dictionary: a ``.safetensors`` path is causalab's one stamped file; any
    other is a folder as SAELens writes one (cfg.json + sae_weights.safetensors, the stamp
    in the weights' metadata), which SAELens and causalab both load."""
    from causalab.engine.dictionary import save_dictionary

    path = directory / save.file_path
    if save.file_path.endswith(TENSOR_SUFFIX):
        return [save_dictionary(path, value.value, metadata)]
    from causalab.compile.bundles.saelens import hook_name
    from causalab.engine.featurizers import write_saelens_dir

    output = next(o for o in node.outputs if o.name == name)
    address = find_read(node.pass_, output.read).address
    containment.inside(directory, path)
    cfg = {"hook_name": hook_name(address.component, address.layer)}
    folder = Path(write_saelens_dir(path, value.value, cfg, stamp=metadata))
    return [str(folder / SAELENS_WEIGHTS), str(folder / SAELENS_CONFIG)]


def run_fit_step(node: Fit, model: Runner, state: WalkState, directory: Path,
                 run_pass: Callable) -> list[str]:
    """Train the fit's featurizers (``causalab.engine.fit``), then write its saves."""
    from causalab.engine.fit import run_fit

    results = run_fit(node, model, state.featurizers, state, run_pass=run_pass,
                      events=state.events, point=state.point,
                      step=step_label(node.name, state))
    node.results.update(results)
    written = []
    for save in node.saves:
        stamp = _twin(save_stamp(save.value, _gate_place(save.value, state), state.model_ref,
                                 state.digest), state)
        value = results.get(save.value)
        if value is None:  # <gate>.mask: the hard mask the fit left, 1.0 per unit kept
            value = state.featurizers[save.value.removesuffix(".mask")].hard_mask().float()
        written.append(record.write_tensor(directory / save.file_path, value, stamp,
                                           root=directory))
    last = results.get("eval")
    for save in node.eval_saves:
        name = _plain(save.value, last.metrics if last else {})
        rows = metric_rows(node.eval, last, name, state.digest, name)
        written.append(record.write_json(directory / save.file_path, rows, root=directory))
    return written


def _gate_place(value: str, state: WalkState) -> dict[str, str]:
    """Where a fit's save was taken: a ``<gate>.mask`` at its gate's site, a loss nowhere."""
    spec = state.specs.get(value.removesuffix(".mask")) if value.endswith(".mask") else None
    keys = ("site", "component", "layer", "heads", "units")
    return {key: spec.stamp[key] for key in keys if key in spec.stamp} if spec else {}


def run_weights(node: Weights, state: WalkState, directory: Path) -> list[str]:
    """Publish each named featurizer's ``weight`` and write stamped bundles."""
    tensors = weights_results(node.names, state.featurizers)
    for name, value in tensors.items():
        state.published[name] = output_rules.Published(value, None, None, "weights")
    node.results.update(tensors)
    written = []
    for save in node.saves:
        spec = state.specs[save.value]
        metadata = _twin(stamp_metadata(document_stamp(spec), produced_by=state.digest), state)
        bundle = {**state.featurizers[save.value].tensors(), TENSOR_KEY: tensors[save.value]}
        written.append(record.write_tensors(directory / save.file_path, bundle, metadata,
                                            root=directory))
    return written
