"""Every mechanism through every featurizer, run end to end, against a hooked transformers oracle.

Each case is a whole document through ``run_document`` on the tiny Llama (4 rows of unequal
length, so left padding is live): its metric tables and saved reads are compared with a plain
``AutoModelForCausalLM`` forward whose torch hook applies docs/format.md §7.4 and §8.2 by hand at the
last token. The oracle's featurizers are written here from the format alone (the subspace
basis by a dense Cayley solve), never taken from causalab. Values agree to 1e-6 in fp32;
the exactness claims of docs/format.md §7.4 and §8.2 (an unchanged sae/linear feature vector, all-on and
all-off gates, lerp at t = 1 and t = 0) are checked bit for bit on the model's logits.
"""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from causalab.engine.bundle_files import restamp

TOL = dict(atol=1e-6, rtol=1e-6)
D = 16
LITERAL = 0.05
PAIRS = [  # prompts of different token lengths; every answer is one token
    ("If today is Monday, tomorrow is", "If today is Friday, tomorrow is", " Tuesday", " Saturday"),
    ("Today is Sunday, so tomorrow is", "If today is Wednesday, tomorrow is", " Monday", " Thursday"),
    ("If today is Tuesday, then the day after today is", "Today is Saturday, tomorrow is",
     " Wednesday", " Sunday"),
    ("Tomorrow comes after Thursday, which is", "The day after Monday is", " Friday", " Tuesday"),
]
ROWS = len(PAIRS)

# name -> (document site, columns of the module's tensor that the site keeps)
SITES = {
    "resid": ({"component": "block_output", "layers": [0]}, list(range(D))),
    "heads": ({"component": "attention_premix", "layers": [0], "heads": [1, 3]},
              [4, 5, 6, 7, 12, 13, 14, 15]),
    "units": ({"component": "mlp_activation", "layers": [0], "units": [3, 17, 40, 41, 60]},
              [3, 17, 40, 41, 60]),
}

# mechanism -> programs: model name -> [(mechanism, operand kind or None, params)]
PROGRAMS = {
    "swap": {op: [("swap", op, {})] for op in ("cf", "lit", "mean")},
    "add_scaled": {op: [("add_scaled", op, {"scale": 0.7})] for op in ("cf", "lit", "mean")},
    "lerp": {op: [("lerp", op, {"t": 0.3})] for op in ("cf", "lit", "mean")},
    "gaussian": {"noise": [("gaussian", None, {"seed": 7, "scale": 0.05})]},
    "clamp": {"bounded": [("clamp", None, {"lo": -0.01, "hi": 0.02})]},
    "renormalize": {"restored": [("add_scaled", "mean", {"scale": 3.0}), ("renormalize", None, {})],
                    "pushed": [("add_scaled", "cf", {"scale": 2.0}), ("renormalize", None, {})]},
}
FEATURES = {"subspace": [0, 2], "sae": [1, 5, 9, 20]}


def cayley_dense(w: torch.Tensor) -> torch.Tensor:
    """Q = (I − A)⁻¹ (I + A) E, A = W Eᵀ − E Wᵀ, with the d×d matrices formed and solved."""
    d, k = w.shape
    eye = torch.eye(d, dtype=torch.float64)
    e = eye[:, :k]
    a = w.double() @ e.T - e @ w.double().T
    return torch.linalg.solve(eye - a, (eye + a) @ e).float()


def subspace_weight(d: int, k: int, seed: int) -> torch.Tensor:
    """The untrained draw docs/format.md §8.2 names: a normal (d, k) draw from ``seed``, over √d."""
    return torch.randn(d, k, generator=torch.Generator().manual_seed(seed)) / math.sqrt(d)


def basis_oracle(q: torch.Tensor) -> SimpleNamespace:
    return SimpleNamespace(feat=lambda x: x @ q,
                           inv=lambda f, x: f @ q.T + (x - (x @ q) @ q.T))


def dictionary_oracle(t: dict, relu: bool) -> SimpleNamespace:
    def enc(x):
        pre = (x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]
        return torch.relu(pre) if relu else pre

    def dec(f):
        return f @ t["W_dec"] + t["b_dec"]
    return SimpleNamespace(feat=enc, inv=lambda f, x: dec(f) + (x - dec(enc(x))), dec=dec)


IDENTITY = SimpleNamespace(feat=lambda x: x, inv=lambda f, x: f)


def gate_oracle(theta: torch.Tensor) -> SimpleNamespace:
    return SimpleNamespace(feat=lambda x: x, inv=lambda f, x: torch.where(theta > 0, f, x))


def _mechanism(name: str, f, op, f0, params: dict):
    if name == "swap":
        return torch.broadcast_to(torch.as_tensor(op, dtype=f.dtype), f.shape).clone()
    if name == "add_scaled":
        return f + params.get("scale", 1.0) * op
    if name == "lerp":
        return (1 - params["t"]) * f + params["t"] * op
    if name == "gaussian":
        noise = torch.randn(f.shape, generator=torch.Generator("cpu").manual_seed(params["seed"]))
        return f + params["scale"] * noise
    if name == "clamp":
        return torch.clamp(f, min=params.get("lo"), max=params.get("hi"))
    assert name == "renormalize"
    return f * f0.norm(dim=-1, keepdim=True) / f.norm(dim=-1, keepdim=True)


def _hook(model, site: str, edit):
    """Register ``edit((batch, seq, full) tensor) -> tensor`` where ``site``'s tensor lives."""
    layer = model.model.layers[0]
    if site == "heads":
        def pre(module, args, kwargs):
            return (edit(args[0]), *args[1:]), kwargs
        return layer.self_attn.o_proj.register_forward_pre_hook(pre, with_kwargs=True)
    module = layer if site == "resid" else layer.mlp.act_fn

    def post(module, args, output):
        if isinstance(output, tuple):
            return (edit(output[0]), *output[1:])
        return edit(output)
    return module.register_forward_hook(post)


def hooked(model, enc: dict, site: str, edit=None) -> torch.Tensor:
    """Logits at the last token, with ``edit`` applied at ``site`` (none: a plain forward)."""
    handle = _hook(model, site, edit) if edit is not None else None
    try:
        with torch.no_grad():
            return model(**enc).logits[:, -1]
    finally:
        if handle is not None:
            handle.remove()


def site_value(world, site: str, enc: dict) -> torch.Tensor:
    """The site's selected value at the last token of an un-intervened forward, (rows, width)."""
    store = {}

    def keep(tensor):
        store["x"] = tensor[:, -1, SITES[site][1]].clone()
        return tensor
    hooked(world.model, enc, site, keep)
    return store["x"]


def expect(world, site: str, fz, program, features=None):
    """(logits (rows, vocab), written site value (rows, width)) of ``program`` at the last token."""
    cf_f = fz.feat(site_value(world, site, world.cf))
    operands = {"cf": cf_f, "mean": cf_f.mean(0), "lit": LITERAL, None: None}
    cols, store = SITES[site][1], {}

    def edit(tensor):
        tensor = tensor.clone()
        start = s = tensor[:, -1, cols]
        for name, op_kind, params in program:
            f = fz.feat(s)
            idx = list(range(f.shape[-1])) if features is None else features
            op = operands[op_kind]
            op = op[..., idx] if isinstance(op, torch.Tensor) else op
            changed = f.clone()
            changed[:, idx] = _mechanism(name, f[:, idx], op, fz.feat(start)[:, idx], params)
            s = fz.inv(changed, s)
        tensor[:, -1, cols] = s
        store["s"] = s
        return tensor
    return hooked(world.model, world.base, site, edit), store["s"]


def _stamp(world, kind: str, d: int, k: int | None = None) -> dict[str, str]:
    # Each kind's stamp names its own parametrization (docs/format.md §8.3).
    parametrization = {"pca": "basis", "gate": "sigmoid_logits"}.get(kind, "cayley")
    stamp = {"kind": kind, "d": str(d), "parametrization": parametrization, "site": "target",
             "component": "block_output", "layer": "0", "model_key": world.resolved.key,
             "model_revision": world.resolved.revision, "model_dtype": "fp32",
             "featurizer_dtype": "fp32", "produced_by": "0" * 64, "engine": "causalab"}
    if k is not None:
        stamp["k"] = str(k)
    return stamp


def _bad_dictionary(seed: int, d: int, k: int) -> dict[str, torch.Tensor]:
    """Random weights and biases: a dictionary that reconstructs nothing well.

    Scaled to the tiny model's residual stream (entries about 0.03), so that fp32 rounding
    of the decoder is at the activation's own scale and 1e-6 on the logits is meaningful.
    """
    g = torch.Generator().manual_seed(seed)
    return {"W_enc": torch.randn(d, k, generator=g) * 0.8, "W_dec": torch.randn(k, d, generator=g) * 0.1,
            "b_enc": torch.randn(k, generator=g) * 0.05, "b_dec": torch.randn(d, generator=g) * 0.03}


def _write_bundles(world, root) -> None:
    g = torch.Generator().manual_seed(3)
    q, _ = torch.linalg.qr(torch.randn(D, 4, generator=g))
    world.pca_q = q.contiguous()
    save_file({"weight": world.pca_q}, str(root / "pca.safetensors"),
              metadata=_stamp(world, "pca", D, 4))
    restamp(str(root / "pca.safetensors"))  # written by hand: the digest a stamp needs
    world.thetas = {"mixed": torch.randn(D, generator=g), "on": torch.ones(D), "off": -torch.ones(D)}
    assert 0 < int((world.thetas["mixed"] > 0).sum()) < D
    for name, theta in world.thetas.items():
        save_file({"weight": theta}, str(root / f"gate_{name}.safetensors"),
                  metadata=_stamp(world, "gate", D))
        restamp(str(root / f"gate_{name}.safetensors"))
    world.dictionaries = {"sae": _bad_dictionary(5, D, 32), "linear": _bad_dictionary(6, D, 6),
                          "sae_units": _bad_dictionary(7, 5, 9)}
    for name, tensors in world.dictionaries.items():
        save_file(tensors, str(root / f"{name}.safetensors"))  # unstamped: trust_unstamped


@pytest.fixture(scope="module")
def world(tiny, oracle, kit, tmp_path_factory):
    resolved = tiny("tiny-llama")
    model, tokenizer = oracle(resolved.path)
    root = tmp_path_factory.mktemp("write_matrix")
    rows = kit.pair_rows(PAIRS)
    for row, (_, _, base_answer, _) in zip(rows, PAIRS):
        row["probe"] = base_answer
    world = SimpleNamespace(resolved=resolved, model=model, root=root,
                            data_root=kit.write_table(root / "data", "pairs", rows),
                            base=kit.encode(tokenizer, [p[0] for p in PAIRS]),
                            cf=kit.encode(tokenizer, [p[1] for p in PAIRS]))
    ids = {col: [tokenizer(p[i], add_special_tokens=False)["input_ids"] for p in PAIRS]
           for col, i in (("base_answer", 2), ("cf_answer", 3))}
    assert all(len(found) == 1 for column in ids.values() for found in column)
    world.ids = {col: torch.tensor([found[0] for found in column]) for col, column in ids.items()}
    _write_bundles(world, root)
    world.clean = hooked(model, world.base, "resid")
    return world


def featurizer(world, kind: str, site: str = "resid", gate: str = "mixed"):
    """(document declaration or None, oracle featurizer) of ``kind`` at ``site``."""
    d = len(SITES[site][1])
    if kind == "identity":
        return None, IDENTITY
    if kind == "subspace":
        k, seed = (4, 11) if site == "resid" else (3, 5)
        q = cayley_dense(subspace_weight(d, k, seed))
        return {"kind": "subspace", "k": k, "seed": seed}, basis_oracle(q)
    if kind == "pca":
        path = str(world.root / "pca.safetensors")
        return {"kind": "pca", "k": 4, "file_path": path}, basis_oracle(world.pca_q)
    if kind == "gate":
        return ({"kind": "gate", "file_path": str(world.root / f"gate_{gate}.safetensors")},
                gate_oracle(world.thetas[gate]))
    name = kind if site == "resid" else kind + "_units"
    decl = {"kind": kind, "file_path": str(world.root / f"{name}.safetensors"),
            "trust_unstamped": True}
    return decl, dictionary_oracle(world.dictionaries[name], relu=kind == "sae")


def _operand(kind):
    return {"cf": "cf", "lit": LITERAL, "mean": {"ref": "mean"}, "own": "own"}[kind]


def document(world, site: str, featurizers: dict, models: dict) -> dict:
    """A harvest step publishing the counterfactual mean, then one step running ``models``.

    ``featurizers`` maps a featurizer name to its declaration; ``models`` maps a model name to
    ``(featurizer name, features, [(mechanism, operand kind, params)])``; the reads ``cf``,
    ``own`` (the base) and ``h`` go through the first model's featurizer. Each model saves
    its logit_diff and token_logit tables and its last-token logits and site value.
    """
    first = next(iter(models.values()))[0]
    target = {"site": "target", "pos": -1, **({"featurizer": first} if first != "identity" else {})}
    reads = {"cf": {**target, "input": "counterfactual"}, "own": {**target, "input": "base"},
             "clean": {"site": "target", "pos": -1, "input": "base"}}
    writes, body_models, metrics, outputs, saves = {}, {}, {}, {}, []
    for model_name, (fname, features, program) in models.items():
        names = []
        for i, (mechanism, op_kind, params) in enumerate(program):
            write = {"site": "target", "pos": -1, "mechanism": mechanism}
            write.update({"featurizer": fname} if fname != "identity" else {})
            write.update({"operand": _operand(op_kind)} if op_kind else {})
            write.update({"params": params} if params else {})
            write.update({"features": features} if features else {})
            names.append(f"{model_name}_{i}")
            writes[names[-1]] = write
        body_models[model_name] = {"input": "base", "writes": names}
        reads[f"logits_{model_name}"] = {"site": "head", "pos": -1, "model": model_name, "input": "base"}
        reads[f"after_{model_name}"] = {"site": "target", "pos": -1, "model": model_name, "input": "base"}
        metrics[f"ld_{model_name}"] = {"kind": "logit_diff", "of": f"logits_{model_name}",
                                       "a": "cf_answer", "b": "base_answer"}
        metrics[f"tl_{model_name}"] = {"kind": "token_logit", "of": f"logits_{model_name}", "token": "probe"}
        for kind in ("logits", "after"):
            outputs[f"o_{kind}_{model_name}"] = f"{kind}_{model_name}"
            saves.append({"value": f"o_{kind}_{model_name}", "file_path": f"{kind}_{model_name}.safetensors"})
        saves += [{"value": f"{m}_{model_name}", "file_path": f"{m}_{model_name}.json"} for m in ("ld", "tl")]
    outputs["o_clean"] = "clean"
    saves.append({"value": "o_clean", "file_path": "clean.safetensors"})
    rows = {"base": "pairs", "counterfactual": "pairs"}
    return {
        "model": {"key": world.resolved.key, "revision": world.resolved.revision, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": SITES[site][0], "head": {"component": "lm_head"}},
        "featurizers": featurizers,
        "interventions": {
            "harvest": {"reads": {"h": {**target, "input": "counterfactual"}}},
            "apply": {"reads": reads, "writes": writes, "models": body_models, "metrics": metrics}},
        "steps": {
            "harvest": {"kind": "observe", "interventions": "harvest", "rows": {"counterfactual": "pairs"},
                        "outputs": {"mean": {"read": "h", "reduce": "mean"}}},
            "apply": {"kind": "observe", "interventions": "apply", "rows": rows,
                      "outputs": outputs, "saves": saves}},
    }


def run(world, doc: dict, out) -> dict:
    """Run ``doc`` through the pipeline; read back its tables and tensors per model."""
    from causalab.pipeline import run_document

    run_document(doc, out=str(out), data_root=world.data_root)
    got = {"clean": load_file(str(out / "clean.safetensors"))["weight"][:, 0]}
    for model_name in doc["interventions"]["apply"]["models"]:
        entry = {}
        for kind in ("logits", "after"):
            entry[kind] = load_file(str(out / f"{kind}_{model_name}.safetensors"))["weight"][:, 0]
        for metric in ("ld", "tl"):
            table = json.loads((out / f"{metric}_{model_name}.json").read_text())
            assert [row["eligible"] for row in table] == [True] * ROWS
            entry[metric] = torch.tensor([row["value"] for row in table], dtype=torch.float64)
        got[model_name] = entry
    return got


def check_against_oracle(world, entry: dict, logits: torch.Tensor, written: torch.Tensor) -> None:
    """Tables, logits and the read-back site value of one model agree with the oracle."""
    rows = torch.arange(ROWS)
    want_ld = logits[rows, world.ids["cf_answer"]] - logits[rows, world.ids["base_answer"]]
    want_tl = logits[rows, world.ids["base_answer"]]
    assert torch.allclose(entry["logits"], logits, **TOL)
    assert torch.allclose(entry["ld"], want_ld.double(), **TOL)
    assert torch.allclose(entry["tl"], want_tl.double(), **TOL)
    assert torch.allclose(entry["after"], written, **TOL)


KINDS = ["identity", "subspace", "pca", "gate", "sae", "linear"]
MATRIX = [pytest.param(m, k, id=f"{m}-through-{k}") for m in PROGRAMS for k in KINDS]


def _check_programs(world, out, site: str, mechanism: str, kind: str, features) -> None:
    """Run every program of ``mechanism`` through ``kind`` at ``site``; each must move the
    logits and agree with the oracle."""
    decl, fz = featurizer(world, kind, site)
    fname = "identity" if decl is None else "feat"
    models = {name: (fname, features, program) for name, program in PROGRAMS[mechanism].items()}
    got = run(world, document(world, site, {} if decl is None else {"feat": decl}, models), out)
    for name, program in PROGRAMS[mechanism].items():
        logits, written = expect(world, site, fz, program, features)
        assert not torch.allclose(logits, world.clean, **TOL), f"{name} moved nothing"
        check_against_oracle(world, got[name], logits, written)


@pytest.mark.parametrize(("mechanism", "kind"), MATRIX)
def test_a_write_through_a_featurizer_gives_the_logits_of_a_hooked_oracle(world, tmp_path, mechanism,
                                                                          kind):
    _check_programs(world, tmp_path / "out", "resid", mechanism, kind, FEATURES.get(kind))


SELECTIONS = [
    pytest.param("heads", "swap", "subspace", [1], id="swap-through-subspace-at-attention-heads"),
    pytest.param("heads", "renormalize", "identity", None,
                 id="renormalize-through-identity-at-attention-heads"),
    pytest.param("units", "lerp", "sae", [0, 4, 8], id="lerp-through-sae-at-mlp-units"),
    pytest.param("units", "clamp", "identity", None, id="clamp-through-identity-at-mlp-units"),
]


@pytest.mark.parametrize(("site", "mechanism", "kind", "features"), SELECTIONS)
def test_a_write_at_a_heads_or_units_selection_touches_only_its_slice(world, tmp_path, site, mechanism,
                                                                      kind, features):
    _check_programs(world, tmp_path / "out", site, mechanism, kind, features)


def _same_model(got: dict, name: str, other: dict) -> None:
    assert torch.equal(got[name]["logits"], other["logits"]), name
    assert torch.equal(got[name]["after"], other["after"]), name


@pytest.mark.parametrize("kind", ["sae", "linear"])
def test_an_unchanged_dictionary_feature_vector_returns_the_model_bit_for_bit(world, tmp_path, kind):
    decl, fz = featurizer(world, kind)
    clean_x = site_value(world, "resid", world.base)
    error = (fz.dec(fz.feat(clean_x)) - clean_x).norm(dim=-1) / clean_x.norm(dim=-1)
    assert bool((error > 1.0).all()), "the dictionary should reconstruct badly"
    features = FEATURES.get(kind, [0, 3])
    models = {"own": ("feat", None, [("swap", "own", {})]),
              "own_features": ("feat", features, [("swap", "own", {})]),
              "plus_zero": ("feat", None, [("add_scaled", "lit", {"scale": 0.0})]),
              "untouched": ("identity", None, [("add_scaled", "lit", {"scale": 0.0})])}
    doc = document(world, "resid", {"feat": decl}, models)
    got = run(world, doc, tmp_path / "out")
    for name in ("own", "own_features", "plus_zero"):
        _same_model(got, name, got["untouched"])
        assert torch.equal(got[name]["after"], got["clean"]), name
        # Same ids, mask and position ids through the same kernels: the un-intervened
        # forward is the plain transformers one to the bit, so a no-op write must be too.
        assert torch.equal(got[name]["logits"], world.clean), name


def test_a_gate_all_on_is_plain_patching_and_all_off_is_no_write_bit_for_bit(world, tmp_path):
    got = run(world, document(world, "resid", {}, {
        "patched": ("identity", None, [("swap", "cf", {})]),
        "none": ("identity", None, [])}), tmp_path / "plain")
    for name in ("on", "off"):  # one document each: the operand is read through its own gate
        doc = document(world, "resid", {"gate": featurizer(world, "gate", gate=name)[0]},
                       {name: ("gate", None, [("swap", "cf", {})])})
        got[name] = run(world, doc, tmp_path / name)[name]
    _same_model(got, "on", got["patched"])
    _same_model(got, "off", got["none"])
    assert torch.equal(got["off"]["after"], got["clean"])
    logits, written = expect(world, "resid", IDENTITY, [("swap", "cf", {})])
    assert torch.equal(got["on"]["logits"], logits) and torch.equal(got["on"]["after"], written)
    assert torch.equal(got["off"]["logits"], world.clean)


@pytest.mark.parametrize("kind", ["identity", "subspace", "sae"])
def test_lerp_at_one_is_a_swap_and_at_zero_changes_nothing_bit_for_bit(world, tmp_path, kind):
    decl, fz = featurizer(world, kind)
    fname = "identity" if decl is None else "feat"
    features = FEATURES.get(kind)
    doc = document(world, "resid", {} if decl is None else {"feat": decl}, {
        "swap": (fname, features, [("swap", "cf", {})]),
        "lerp_one": (fname, features, [("lerp", "cf", {"t": 1.0})]),
        "lerp_zero": (fname, features, [("lerp", "cf", {"t": 0.0})]),
        "none": ("identity", None, [])})
    got = run(world, doc, tmp_path / "out")
    _same_model(got, "lerp_one", got["swap"])
    _same_model(got, "lerp_zero", got["none"])
    assert torch.equal(got["lerp_zero"]["after"], got["clean"])
    assert torch.equal(got["lerp_zero"]["logits"], world.clean)
    logits, written = expect(world, "resid", fz, [("swap", "cf", {})], features)
    check_against_oracle(world, got["lerp_one"], logits, written)


def test_a_clamp_to_zero_on_both_sides_is_a_swap_of_zero_bit_for_bit(world, tmp_path):
    doc = document(world, "resid", {}, {
        "clamped": ("identity", None, [("clamp", None, {"lo": 0.0, "hi": 0.0})]),
        "zeroed": ("identity", None, [("swap", "lit", {})])})
    doc["interventions"]["apply"]["writes"]["zeroed_0"]["operand"] = 0.0
    got = run(world, doc, tmp_path / "out")
    _same_model(got, "clamped", got["zeroed"])
