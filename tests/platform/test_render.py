"""Rendering: every composed experiment is a valid document, and the tiny Llama's renderings
are the hand-written corpus documents, digest for digest."""
from __future__ import annotations

import hashlib
import json
import runpy
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from causalab.document import digest, lower, validate
from causalab.errors import UsageError
from causalab.hydra.rendering import CONF, SCAFFOLDING, render
from causalab.hydra.rendering import compose as compose_documents

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
DOCUMENT_KEYS = {"header", "model", "roles", "sites", "featurizers", "interventions", "steps"}
# what each composition rendered to before conf/ was regrouped (scripts/conf_digests.py --write)
RENDERINGS = json.loads((Path(__file__).parent / "conf_renderings.json").read_text())

# corpus document -> the overrides that render it on the tiny Llama
CORPUS = {
    "patching": ["experiment=patching"],
    "neuron_patching": ["experiment=patching", "site=neurons"],
    "head_patching": ["experiment=head_patching"],
    "logit_lens": ["experiment=logit_lens"],
    "zero_ablation": ["experiment=zero_ablation"],
    "mean_ablation": ["experiment=mean_ablation"],
    "steer_renormalize": ["experiment=steer"],
    "das": ["experiment=das_mechanics"],
    "das_apply": ["experiment=das_apply"],
    "dbm": ["experiment=dbm"],
    "pca_harvest": ["experiment=pca"],
    "sae_feature_ablation": ["experiment=sae_ablation"],
}
# documents/real/ -> the overrides that render it (Llama-3.2-1B, all 42 weekday pairs)
REAL = {
    "weekdays_layer_sweep": ["experiment=layer_sweep", "model=llama3_2_1b", "data=weekdays_full"],
    "weekdays_head_patching": ["experiment=head_patching", "model=llama3_2_1b",
                               "data=weekdays_full", "site=head_grid", "site.layers=[10,11,12]"],
}

# documents/real/ioi_* -> their conf twins on SmolLM2 (docs/real-models.md, "IOI on SmolLM2")
IOI = ("ioi_behavior", "ioi_layer_sweep", "ioi_unrelated_sweep", "ioi_head_patching",
       "ioi_logit_lens", "ioi_das", "ioi_attention")


def _point_digests(document: dict) -> list[tuple[str, str]]:
    return [(point.label, digest(point.document)) for point in lower(document)]


def test_the_shipped_groups_are_all_there():
    assert {"patching", "layer_sweep", "head_patching", "das", "das_apply", "dbm",
            "mean_ablation", "zero_ablation", "logit_lens", "steer", "pca",
            "sae_ablation"} <= set(EXPERIMENTS)
    assert {"llama", "gpt2", "gemma2", "qwen2", "tiny_llama", "tiny_gpt2", "tiny_gemma2",
            "tiny_qwen2", "llama3_2_1b"} <= set(MODELS)
    for group in ("site", "data", "tracking", "hydra/launcher"):
        assert list((CONF / group).glob("*.yaml")), group


def _rendered_digest(document: dict) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":"))
                          .encode("utf-8")).hexdigest()


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_renders_to_a_valid_document_on_every_model(experiment):
    for model in MODELS:
        overrides = [f"experiment={experiment}", f"model={model}"]
        document = render(overrides)
        assert set(document) <= DOCUMENT_KEYS, (model, set(document) - DOCUMENT_KEYS)
        points = validate(document)
        assert points, (experiment, model)
        assert _rendered_digest(document) == RENDERINGS[" ".join(overrides)], overrides


def test_every_compare_method_renders_the_document_it_rendered_before_conf_was_regrouped():
    pinned = {key: value for key, value in RENDERINGS.items() if " method=" in key}
    methods = {path.stem for path in (CONF / "method").glob("*.yaml")}
    assert {key.split()[1].removeprefix("method=") for key in pinned} == methods
    for key, expected in pinned.items():
        document = render(key.split())
        assert _rendered_digest(document) == expected, key
        assert validate(document), key


def test_conf_says_each_value_once_mostly():
    """Below a fifth of conf/'s value lines appear in a second file (scripts/conf_duplication.py)."""
    measure = runpy.run_path(str(REPO / "scripts" / "conf_duplication.py"))
    share, total, _ = measure["repeated_share"](CONF)
    assert total > 300 and share < 0.20, f"{share:.1%} of {total} value lines repeated"
    assert measure["value_lines"]("defaults: [a, _self_]\nx: 1  # why\n- {k: v}\nblock:\n") \
        == ["x: 1", "- {k: v}"]


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_tiny_llama_rendering_has_the_digest_of_the_corpus_document(name):
    corpus = json.loads((REPO / "documents" / "v2" / f"{name}.json").read_text())
    rendered = render(CORPUS[name] + ["model=tiny_llama"])
    assert digest(rendered) == digest(corpus)
    assert _point_digests(rendered) == _point_digests(corpus)


@pytest.mark.parametrize("name", sorted(REAL))
def test_the_real_checkpoint_documents_render_from_the_same_groups(name):
    corpus = json.loads((REPO / "documents" / "real" / f"{name}.json").read_text())
    rendered = render(REAL[name])
    assert digest(rendered) == digest(corpus)
    assert _point_digests(rendered) == _point_digests(corpus)


@pytest.mark.parametrize("name", IOI)
def test_the_ioi_documents_render_from_their_conf_twins(name):
    corpus = json.loads((REPO / "documents" / "real" / f"{name}.json").read_text())
    rendered = render([f"experiment={name}", "model=smollm2", "data=ioi"])
    assert digest(rendered) == digest(corpus)
    assert _point_digests(rendered) == _point_digests(corpus)


def test_hydra_only_keys_never_enter_the_document_or_its_digest():
    plain = render(["experiment=patching", "model=tiny_llama"])
    busy = render(["experiment=patching", "model=tiny_llama", "tracking=server",
                   "tracking.uri=http://elsewhere:5000", "run.batch_size=2", "run.resume_mib=0",
                   "run.out=/tmp/x", "run.device_map=auto", "data.harvest=weekdays/train"])
    assert not set(busy) & set(SCAFFOLDING)
    assert digest(busy) == digest(plain)
    moved = render(["experiment=patching", "model=tiny_llama", "site.layer=1"])
    assert moved["sites"]["target"]["layers"] == [1]
    assert digest(moved) != digest(plain)


def test_a_document_value_can_be_overridden_from_the_command_line():
    document = render(["experiment=das_mechanics", "model=tiny_llama", "featurizers.rot.k=4",
                       "+featurizers.rot.file_path=runs:/abc/rot.safetensors"])
    assert document["featurizers"]["rot"] == {"kind": "subspace", "k": 4,
                                              "file_path": "runs:/abc/rot.safetensors"}


@pytest.mark.parametrize("overrides", [["experiment=nowhere"], ["site.layer=0,1"],
                                       ["+model.no_such=${nothing.here}"]],
                         ids=["missing_group_option", "sweep_without_multirun",
                              "broken_interpolation"])
def test_a_bad_override_is_a_usage_error_at_the_overrides(overrides):
    with pytest.raises(UsageError) as refused:
        render(overrides)
    assert refused.value.path == ("overrides",)


def test_the_built_in_model_files_pin_the_tensor_digest_and_state_the_shape():
    from causalab.models import BUILTINS, SCHEME, resolve

    for model in MODELS:
        document = render(["experiment=patching", f"model={model}"])
        key = document["model"]["key"]
        if not key.startswith(SCHEME):
            continue
        assert document["model"]["revision"] == resolve(key).revision, model
        shape = compose_documents([f"model={model}"])["shape"]  # registers causalab.each
        config = BUILTINS[key[len(SCHEME):]]["config"]
        layers = config.get("num_hidden_layers", config.get("n_layer"))
        heads = config.get("num_attention_heads", config.get("n_head"))
        assert (shape["layers"], shape["heads"]) == (layers, heads), model
        assert shape["each_layer"] == [[i] for i in range(layers)]
        assert shape["each_head"] == [[i] for i in range(heads)]


def test_a_family_name_is_one_line_pointing_at_a_built_in():
    for family in ("llama", "gpt2", "gemma2", "qwen2"):
        lines = [line for line in (CONF / "model" / f"{family}.yaml").read_text().splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
        assert lines[0] == "defaults:" and len(lines) == 2, family
        assert render([f"model={family}"])["model"]["key"].startswith("causalab:")


def test_every_experiment_file_is_global_overrides_with_the_command_that_runs_it():
    for path in sorted((CONF / "experiment").glob("*.yaml")):
        text = path.read_text()
        header = [line for line in text.splitlines() if line.startswith("#")]
        assert header[0] == "# @package _global_", path.name
        assert any(f"experiment={path.stem}" in line and "python -m causalab.run" in line
                   for line in header), path.name


def test_document_groups_render_data_and_never_instantiate():
    for path in CONF.rglob("*.yaml"):
        if path.relative_to(CONF).parts[0] != "hydra" and path.name != "config.yaml":
            assert "_target_" not in path.read_text(), path
    assert not (REPO / "causalab" / "hydra.py").exists()


def compose_config(overrides: list[str], hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=hydra)


def test_the_multirun_parent_callback_is_registered():
    config = compose_config([], hydra=True)
    target = config.hydra.callbacks.mlflow_parent._target_
    assert target == "causalab.hydra.callbacks.MultirunParent"
    from causalab.hydra.callbacks import MultirunParent  # the target imports

    assert MultirunParent


@pytest.mark.parametrize("launcher,target,keys", [
    ("joblib", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
     {"n_jobs", "prefer", "backend"}),
    ("submitit_slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
     {"submitit_folder", "timeout_min", "partition", "gpus_per_node", "mem_gb", "nodes"}),
    ("submitit_local", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
     {"submitit_folder", "timeout_min", "gpus_per_node"}),
    # causalab's subclass of hydra-ray-launcher's: a cluster it starts stays on loopback
    ("ray", "hydra_plugins.causalab_launchers.ray_launcher.RayLauncher", {"ray"}),
], ids=["joblib", "submitit_slurm", "submitit_local", "ray"])
def test_each_launcher_config_composes_and_names_its_plugin(launcher, target, keys):
    config = compose_config([f"hydra/launcher={launcher}", "experiment=layer_sweep"], hydra=True)
    assert config.hydra.launcher._target_ == target
    assert keys <= set(config.hydra.launcher)


def test_joblib_is_the_installed_plugin_s_own_config_with_no_shadowing_file():
    from dataclasses import fields

    from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf

    assert not (CONF / "hydra" / "launcher" / "joblib.yaml").exists()
    config = compose_config(["hydra/launcher=joblib"], hydra=True)
    assert set(config.hydra.launcher) == {f.name for f in fields(JobLibLauncherConf)}


def test_a_trained_built_in_that_has_landed_is_what_its_family_name_runs():
    from causalab.models import BUILTINS

    for name, entry in BUILTINS.items():
        if entry["kind"] != "weekday" or not entry["revision"]:
            continue
        family = entry["family"]
        model = render([f"model={family}"])["model"]
        assert model == {"key": f"causalab:{name}", "revision": entry["revision"],
                         "dtype": "fp32"}, f"point conf/model/{family}.yaml at weekday_{family}"


@pytest.mark.parametrize("key,value", [("batch_size", 0), ("resume_mib", -1)])
def test_a_bad_run_option_is_refused_at_its_config_key(key, value, tmp_path):
    from causalab.errors import UsageError
    from causalab.run import _run

    config = compose_config(["experiment=patching", "model=tiny_llama", f"run.{key}={value}",
                             f"run.out={tmp_path / 'out'}", "tracking.enabled=false"])
    with pytest.raises(UsageError) as refused:
        _run(config)
    assert refused.value.path == ("run", key)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overrides", [["experiment=das", "model=llama"],
                                       ["experiment=ioi_das", "model=smollm2"],
                                       ["experiment=ioi_das", "model=smollm2", "data=ioi_names"]],
                         ids=["weekdays", "ioi", "ioi_names"])
def test_a_das_fit_evaluates_on_validation_rows_carved_from_training_never_the_test_rows(
        overrides):
    document = render(overrides)
    fit, test = document["steps"]["fit"], document["steps"]["test"]
    evaluated = set(fit["eval"]["rows"].values())
    (trained,) = set(fit["rows"].values())
    (tested,) = set(test["rows"].values())
    (valid,) = evaluated
    table = trained.split("#")[0]
    assert valid == f"{table}#valid" and trained == f"{table}#train" and tested == f"{table}#test"
    rows = json.loads((REPO / "documents" / "data" / f"{table}.json").read_text())
    ids = {split: {r["example_id"] for r in rows if r["split"] == split}
           for split in ("train", "valid", "test")}
    assert all(ids.values()) and not ids["valid"] & (ids["train"] | ids["test"])
    # every test row is scored once, after the fit, by the test step and the control
    scored = [name for name, step in document["steps"].items()
              if tested in step.get("rows", {}).values()]
    assert scored == ["test", "control"]
