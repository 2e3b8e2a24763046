"""Gemma-3-270M's anatomy: every component, heads and units, the residual sums, the lens, the
sliding window, against a plain transformers forward with hooks written here.

Gemma-3 brings what the Llama-shaped SmolLM2 does not: sandwich norms (the residual receives
the post-attention and post-feedforward norms' outputs), QK-norm (the kernel's query and key
are normed, then rotated), an embedding scaled by sqrt(hidden) inside the embedding module,
sliding-window layers with a global one every sixth, no softcap (its config says none) and a
final norm that multiplies by (1 + weight). The oracle is ``Gemma3ForCausalLM`` loaded with
eager attention, its modeling module's ``eager_attention_forward`` replaced for the forward by
the same arithmetic spelled out below, with hooks on the module boundaries of two layers
(0 sliding, 5 global). The window test runs the real weights under a config whose window is
4 tokens, so positions beyond it occur in short prompts.
"""
from __future__ import annotations

import contextlib
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

from causalab.document import vocab

KEY = "causalab:gemma3-270m"
LAYERS = (0, 5)  # a sliding-window layer and the first global one
LAST = 4
# Prompts of different token lengths (left padding on all but one row).
PROMPTS = ("When Mary and John went to the store, John gave a drink to",
           "The capital of France is",
           "Alice, Bob and Carol sat by the river; later that evening Bob handed the map to")
TOL = dict(atol=1e-4, rtol=1e-4)
_WHOLE = tuple(c for c, row in vocab.COMPONENTS.items() if row["whole_model"])
_LAYERED = tuple(c for c in vocab.COMPONENTS if c not in _WHOLE)
_SUMS = ("block_input", "attention_output", "block_mid", "mlp_output", "block_output")
LENS_LAYERS = (2, 9, 17)


def _eager(seen: dict, edits: dict):
    """Gemma-3's eager attention in plain torch, recording (and editing) its interiors."""
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                  softcap=None, **kwargs):
        layer = module.layer_idx
        on = edits.get(layer, {})
        query, key = on.get("query", lambda v: v)(query), on.get("key", lambda v: v)(key)
        groups = query.shape[1] // key.shape[1]
        keys, values = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        scores = torch.matmul(query, keys.transpose(2, 3)) * scaling
        assert softcap is None  # the config says no attention softcap
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, :, : keys.shape[-2]]
        probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        z = torch.matmul(probs, values).transpose(1, 2).contiguous()
        seen.update({(name, layer): tensor.clone() for name, tensor in
                     (("query", query), ("key", key), ("scores", scores), ("probs", probs),
                      ("z", z))})
        return z, probs
    return attention


@contextlib.contextmanager
def _plain_attention(model, seen: dict, edits: dict | None = None):
    module = sys.modules[type(model).__module__]
    original = module.eager_attention_forward
    module.eager_attention_forward = _eager(seen, edits or {})
    try:
        yield
    finally:
        module.eager_attention_forward = original


def _boundaries(model, layer: int) -> dict:
    """Each module-boundary component of block ``layer``: (module, "in"|"out")."""
    block = model.model.layers[layer]
    return {"block_input": (block, "in"), "attention_input_norm": (block.input_layernorm, "out"),
            "attention_premix": (block.self_attn.o_proj, "in"),
            "attention_output": (block.post_attention_layernorm, "out"),
            "block_mid": (block.pre_feedforward_layernorm, "in"),
            "mlp_input_norm": (block.pre_feedforward_layernorm, "out"),
            "mlp_input": (block.mlp, "in"), "mlp_activation": (block.mlp.act_fn, "out"),
            "mlp_neuron_output": (block.mlp.down_proj, "in"),
            "mlp_output": (block.post_feedforward_layernorm, "out"),
            "block_output": (block, "out")}


def _hooked(model, places: dict, seen: dict) -> list:
    handles = []
    for key, (module, side) in places.items():
        def hook(module, args, kwargs, *output, key=key, side=side):
            value = (args[0] if args else kwargs["hidden_states"]) if side == "in" else output[0]
            seen[key] = (value[0] if isinstance(value, tuple) else value).clone()
        if side == "in":
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        else:
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
    return handles


def _encode(tokenizer, prompts) -> dict:
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return {"input_ids": enc["input_ids"], "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def _oracle_forward(model, enc: dict) -> tuple[dict, torch.Tensor]:
    """({(component, layer): tensor}, logits) of one hooked forward."""
    seen: dict = {}
    places = {(c, layer): where for layer in range(model.config.num_hidden_layers)
              for c, where in _boundaries(model, layer).items()
              if layer in LAYERS or c in _SUMS}
    places[("embeddings", None)] = (model.model.embed_tokens, "out")
    places[("ln_final", None)] = (model.model.norm, "out")
    places[("lm_head", None)] = (model.lm_head, "out")
    handles = _hooked(model, places, seen)
    try:
        with _plain_attention(model, seen), torch.no_grad():
            logits = model(**enc).logits
    finally:
        for handle in handles:
            handle.remove()
    return seen, logits


def _at_last(name: str, value: torch.Tensor) -> torch.Tensor:
    """An oracle tensor's last ``LAST`` positions, flattened as causalab hands them over."""
    if name == "z":  # (batch, seq, heads, head_dim)
        return value[:, -LAST:].flatten(2)
    return value[:, :, -LAST:].transpose(1, 2).flatten(2)  # (batch, heads, seq, X)


def _document(path: str, revision: str, sites: dict, reads: dict, **body) -> dict:
    used = {read["input"] for read in reads.values()}
    roles = {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}}
    return {"model": {"key": path, "revision": revision, "dtype": "fp32",
                      "attn_implementation": "eager"},
            "roles": {r: v for r, v in roles.items() if r in used}, "sites": sites,
            "interventions": {"look": {"reads": reads, **body}},
            "steps": {"look": {"kind": "observe", "interventions": "look",
                               "rows": {role: "rows" for role in used}}}}


def _reading_document(revision: str) -> dict:
    sites = {c: {"component": c} for c in _WHOLE}
    sites.update({f"{c}@{layer}": {"component": c, "layers": [layer]}
                  for c in _LAYERED for layer in LAYERS})
    sites.update({f"{c}@{layer}": {"component": c, "layers": [layer]}
                  for c in _SUMS for layer in range(18)})
    sites.update({"z_heads": {"component": "attention_z", "layers": [5], "heads": [1, 3]},
                  "key_head": {"component": "attention_key", "layers": [0], "heads": [0]},
                  "units": {"component": "mlp_activation", "layers": [0], "units": [7, 1000]}})
    sites.update({f"lens@{layer}": {"component": "block_output", "layers": [layer]}
                  for layer in LENS_LAYERS})
    reads = {name: {"site": name, "pos": {"last": LAST}, "input": "base"} for name in sites
             if not name.startswith("lens@")}
    reads.update({name: {"site": name, "pos": -1, "input": "base", "view": "logits"}
                  for name in sites if name.startswith("lens@")})
    return _document(KEY, revision, sites, reads)


def _run(document: dict, rows: list[dict], root: Path) -> dict:
    import causalab.compile
    from causalab.engine.weights import load_model
    from causalab.engine.walk import run_plan

    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "rows.json").write_text(json.dumps(rows))
    plan = causalab.compile.compile_document(document, data_root=str(root / "data"))
    run_plan(plan, load_model(plan.model), out=str(root / "out"))
    return next(n for n in plan.children if getattr(n, "name", None) == "look").results["reads"]


def _rows(pairs) -> list[dict]:
    return [{"input": base, "counterfactual_inputs": [cf], "example_id": f"r{i}"}
            for i, (base, cf) in enumerate(pairs)]


@pytest.fixture(scope="module")
def plain(gemma3_dir):
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(gemma3_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    return model, load_tokenizer(gemma3_dir)


@pytest.fixture(scope="module")
def measured(gemma3_dir, plain, tmp_path_factory):
    """(causalab's reads, the oracle's tensors, the oracle's logits) on ``PROMPTS``."""
    from causalab.models import BUILTINS

    model, tokenizer = plain
    document = _reading_document(BUILTINS["gemma3-270m"]["revision"])
    reads = _run(document, _rows((p, p) for p in PROMPTS), tmp_path_factory.mktemp("reads"))
    seen, logits = _oracle_forward(model, _encode(tokenizer, PROMPTS))
    return reads, seen, logits


def test_the_built_in_is_gemma3_with_sandwich_norms_qk_norm_and_interleaved_windows(gemma3_dir):
    config = json.loads((Path(gemma3_dir) / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"], config["vocab_size"]) == (
        18, 640, 4, 1, 256, 262144)
    assert config["final_logit_softcapping"] is None and config["sliding_window"] == 512
    assert [i for i, t in enumerate(config["layer_types"]) if t == "full_attention"] == [5, 11, 17]


@pytest.mark.parametrize("component", _LAYERED)
def test_each_layered_component_reads_what_the_hooked_forward_computes(component, measured):
    reads, seen, _ = measured
    interior = {"attention_query": "query", "attention_key": "key", "attention_scores": "scores",
                "attention_probs": "probs", "attention_z": "z"}
    for layer in LAYERS:
        got = reads[f"{component}@{layer}"]
        if component in interior:
            want = _at_last(interior[component], seen[(interior[component], layer)])
        else:
            want = seen[(component, layer)][:, -LAST:]
        assert got.shape == want.shape, (component, layer)
        assert torch.allclose(got, want, **TOL), (component, layer)


def test_the_whole_model_components_read_the_scaled_embedding_final_norm_and_head(
        measured, plain):
    reads, seen, logits = measured
    model, tokenizer = plain
    enc = _encode(tokenizer, PROMPTS)
    assert torch.equal(reads["input_ids"], enc["input_ids"][:, -LAST:])
    scaled = model.model.embed_tokens.weight[enc["input_ids"][:, -LAST:]] * math.sqrt(640)
    assert torch.allclose(reads["embeddings"], scaled, **TOL)
    # Gemma-3 scales inside the embedding module: block 0 receives exactly the embeddings.
    assert torch.equal(reads["embeddings"], reads["block_input@0"])
    assert torch.allclose(reads["ln_final"], seen[("ln_final", None)][:, -LAST:], **TOL)
    assert torch.allclose(reads["lm_head"], seen[("lm_head", None)][:, -LAST:], atol=1e-3)
    assert torch.allclose(reads["logits"], logits[:, -LAST:], atol=1e-3)  # no softcap


def test_the_residual_sums_hold_on_every_block_with_the_post_norms_counted(measured):
    reads, seen, _ = measured
    for layer in range(18):
        got = {part: reads[f"{part}@{layer}"] for part in _SUMS}
        assert torch.allclose(got["block_mid"], got["block_input"] + got["attention_output"],
                              atol=1e-4), layer
        assert torch.allclose(got["block_output"], got["block_mid"] + got["mlp_output"],
                              atol=1e-4), layer
        if layer:
            assert torch.equal(got["block_input"], reads[f"block_output@{layer - 1}"])
        for part in _SUMS:
            assert torch.allclose(got[part], seen[(part, layer)][:, -LAST:], **TOL), (part, layer)


def test_heads_and_units_are_slices_of_the_whole_tensor(measured):
    reads, _, _ = measured
    z = reads["attention_z@5"].unflatten(-1, (4, 256))
    assert torch.equal(reads["z_heads"], z[..., [1, 3], :].flatten(-2))
    assert torch.equal(reads["key_head"], reads["attention_key@0"])  # its one key/value head
    assert torch.equal(reads["units"], reads["mlp_activation@0"][..., [7, 1000]])


def test_the_lens_is_the_final_norm_and_the_head_applied_by_hand(measured, plain):
    reads, seen, _ = measured
    model, _ = plain
    norm = model.model.norm
    for layer in LENS_LAYERS:
        stream = seen[("block_output", layer)][:, -1:]
        # Gemma's RMSNorm in float32, scaled by (1 + weight); then the tied head, no softcap.
        normed = stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + norm.eps)
        hand = (normed * (1.0 + norm.weight)) @ model.model.embed_tokens.weight.T
        assert torch.allclose(reads[f"lens@{layer}"], hand, atol=1e-5, rtol=1e-5), layer
    final = reads["lens@17"]
    assert torch.allclose(final, reads["logits"][:, -1:], atol=1e-3)


@pytest.fixture(scope="module")
def narrow(gemma3_dir, tmp_path_factory):
    """The real weights under a 4-token sliding window: a folder of links and a changed config."""
    folder = tmp_path_factory.mktemp("narrow-window")
    for item in Path(gemma3_dir).iterdir():
        if item.suffix == ".safetensors" or item.name == "tokenizer.json":
            (folder / item.name).symlink_to(item)
        elif item.is_file():
            shutil.copy2(item, folder / item.name)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 4}))
    return str(folder)


WINDOW_PAIRS = (
    ("When Mary and John went to the store, John gave a drink to",
     "When John and Mary went to the store, Mary gave a drink to"),
    ("Yesterday Anna and Peter cooked, and then Peter handed the spoon to",
     "Yesterday Peter and Anna cooked, and then Anna handed the spoon to"),
)


def _content_index(tokenizer, prompts, row: int, index: int) -> int:
    """The padded column of content token ``index`` (after BOS) of row ``row``."""
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    return max(lengths) - lengths[row] + 1 + index


def test_a_write_beyond_a_sliding_window_gives_the_hooked_logits(narrow, tmp_path):
    from transformers import AutoModelForCausalLM

    from causalab.models import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(narrow, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tokenizer = load_tokenizer(narrow)
    sites = {"early": {"component": "block_output", "layers": [0]},
             "attn": {"component": "attention_output", "layers": [1]},
             "probs": {"component": "attention_probs", "layers": [1]},
             "head": {"component": "lm_head"}}
    reads = {"v_cf": {"site": "early", "pos": 2, "input": "counterfactual"},
             "a_cf": {"site": "attn", "pos": -1, "input": "counterfactual"},
             "pattern": {"site": "probs", "pos": -1, "input": "base"},
             "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}}
    writes = {"early": {"site": "early", "pos": 2, "mechanism": "swap", "operand": "v_cf"},
              "attn": {"site": "attn", "pos": -1, "mechanism": "swap", "operand": "a_cf"}}
    document = _document(narrow, "main", sites, reads, writes=writes,
                         models={"patched": {"input": "base", "writes": ["early", "attn"]}})
    got = _run(document, _rows(WINDOW_PAIRS), tmp_path)
    bases, cfs = [b for b, _ in WINDOW_PAIRS], [c for _, c in WINDOW_PAIRS]
    columns = [_content_index(tokenizer, bases, row, 2) for row in range(len(bases))]
    kept, seen = {}, {}
    block0, post = model.model.layers[0], model.model.layers[1].post_attention_layernorm

    def keep(name, column=None):
        def hook(module, args, output):
            kept[name] = output[torch.arange(len(columns)), columns].clone() if column else \
                output[:, -1].clone()
        return hook

    def put(name, column=None):
        def hook(module, args, output):
            output = output.clone()
            if column:
                output[torch.arange(len(columns)), columns] = kept[name]
            else:
                output[:, -1] = kept[name]
            return output
        return hook

    def forward(prompts, hooks):
        handles = [module.register_forward_hook(hook) for module, hook in hooks]
        try:
            with _plain_attention(model, seen), torch.no_grad():
                return model(**_encode(tokenizer, prompts)).logits[:, -1]
        finally:
            for handle in handles:
                handle.remove()
    # The two prompts of a row have one length, so a column is the same place on both sides.
    assert columns == [_content_index(tokenizer, cfs, row, 2) for row in range(len(cfs))]
    forward(bases, [])
    pattern = seen[("probs", 1)][:, :, -1]  # the clean base forward's, (rows, heads, keys)
    forward(cfs, [(block0, keep("early", True)), (post, keep("attn"))])
    want = forward(bases, [(block0, put("early", True)), (post, put("attn"))])
    assert torch.allclose(got["logits"][:, 0], want, atol=1e-3)
    assert torch.allclose(got["pattern"][:, 0], pattern.flatten(1), atol=1e-5)
    # The last token sees only the 4 newest keys at a sliding layer, so the patched column
    # (far behind it) reaches it through the global layers alone.
    width = pattern.shape[-1]
    assert torch.all(pattern[..., : width - 4] == 0) and pattern[..., width - 4:].sum() > 0
    assert max(columns) < width - 4
