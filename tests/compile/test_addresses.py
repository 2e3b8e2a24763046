"""Addresses, widths and availability of the 21 components on the four built-in families."""
from __future__ import annotations

import pytest
from transformers import GPT2Config, LlamaConfig

from causalab.compile.addresses import component_table, resolve_address
from causalab.document.vocab import COMPONENTS
from causalab.errors import CompileError

FAMILIES = ("llama", "gpt2", "gemma2", "qwen2")

SITE = ("sites", "t")


def expected_widths(config) -> dict:
    """Widths computed here from the config, independently of the compiler."""
    c = config
    hidden = getattr(c, "n_embd", None) or c.hidden_size
    heads = getattr(c, "n_head", None) or c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    mlp = (c.n_inner or 4 * hidden) if c.model_type == "gpt2" else c.intermediate_size
    widths = {name: hidden for name in COMPONENTS}
    widths.update(input_ids=None, attention_scores=None, attention_probs=None,
                  attention_query=heads * head_dim, attention_key=kv * head_dim,
                  attention_z=heads * head_dim, attention_premix=heads * head_dim,
                  mlp_activation=mlp, mlp_neuron_output=mlp,
                  lm_head=c.vocab_size, logits=c.vocab_size)
    return widths


@pytest.mark.parametrize("family", FAMILIES)
def test_every_component_has_the_width_its_config_implies(builtin, family):
    _, config, _ = builtin[family]
    want = expected_widths(config)
    assert len(COMPONENTS) == 21
    for name, row in COMPONENTS.items():
        layer = None if row["whole_model"] else 1
        attn = "eager" if row["eager_only"] else None
        address = resolve_address(name, layer, None, None, config, attn, SITE)
        assert address.width == want[name], name
        assert address.accessor == row["accessor"]
        assert address.seq_axis == row["seq_axis"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_component_table_marks_eager_only_components_unavailable(builtin, family):
    _, config, _ = builtin[family]
    table = component_table(config, None)
    assert set(table) == set(COMPONENTS)
    assert not table["attention_probs"]["resolves"] and "eager" in table["attention_probs"]["why"]
    assert table["block_output"] == {"resolves": True, "width": 16, "op": "layers_output", "why": ""}
    assert component_table(config, "eager")["attention_scores"]["resolves"]


def test_kv_heads_narrow_the_key_on_gemma2_and_qwen2(builtin):
    for family in ("gemma2", "qwen2"):
        config = builtin[family][1]
        key = resolve_address("attention_key", 0, [1], None, config, None, SITE)
        assert (key.full_width, key.groups, key.per_group, key.width) == (8, 2, 4, 4)


def test_order_sorts_whole_model_places_around_the_stack(builtin):
    config = builtin["llama"][1]
    order = lambda c, l=None: resolve_address(c, l, None, None, config, None, SITE).order
    assert order("input_ids") == (-1, -2) and order("embeddings") == (-1, -1)
    assert order("block_output", 1) == (1, 60) and order("lm_head") == (2, 1001)
    assert sorted([order("mlp_output", 0), order("attention_query", 0), order("block_input", 1)]) \
        == [(0, 11), (0, 50), (1, 0)]


def test_a_gpt2_config_without_n_inner_has_four_times_the_stream_in_its_mlp():
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_inner=None, vocab_size=50)
    assert resolve_address("mlp_activation", 0, None, None, config, None, SITE).width == 128


def test_a_real_llama_config_gives_the_documented_widths():
    config = LlamaConfig(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, intermediate_size=8192,
                         vocab_size=128256)
    width = lambda c: resolve_address(c, 12, None, None, config, None, SITE).width
    assert (width("attention_query"), width("attention_key"), width("mlp_activation")) \
        == (2048, 512, 8192)
    premix = resolve_address("attention_premix", 12, [28], None, config, None, SITE)
    assert (premix.width, premix.groups, premix.per_group, premix.heads) == (64, 32, 64, (28,))


def test_units_select_single_features(builtin):
    address = resolve_address("mlp_activation", 0, None, [0, 5, 63], builtin["llama"][1], None, SITE)
    assert (address.width, address.groups, address.per_group, address.full_width) == (3, 64, 1, 64)


@pytest.mark.parametrize("component", ["attention_scores", "attention_probs"])
def test_an_eager_only_component_under_another_implementation_is_refused(builtin, component):
    with pytest.raises(CompileError) as err:
        resolve_address(component, 0, None, None, builtin["llama"][1], "sdpa", SITE)
    assert err.value.path == SITE + ("component",)
    assert "eager" in str(err.value)


def test_a_layer_out_of_range_is_refused_with_the_layer_count(builtin):
    with pytest.raises(CompileError) as err:
        resolve_address("block_output", 2, None, None, builtin["gpt2"][1], None, SITE)
    assert err.value.path == SITE + ("layers",)
    assert "2 layers" in str(err.value)


def test_an_unknown_component_is_refused_naming_the_nearest_and_where_the_21_are_listed(builtin):
    with pytest.raises(CompileError) as err:
        resolve_address("block_outptu", 0, None, None, builtin["llama"][1], None, SITE)
    assert err.value.path == SITE + ("component",)
    assert "did you mean block_output?" in str(err.value)
    assert f"{len(COMPONENTS)} components: causalab vocab" in str(err.value)


def test_a_head_past_the_end_is_refused(builtin):
    with pytest.raises(CompileError) as err:
        resolve_address("attention_key", 0, [2], None, builtin["qwen2"][1], None, SITE)
    assert err.value.path == SITE + ("heads",)
    assert "head 2 of a 2-head tensor" in str(err.value)


def test_a_unit_past_the_end_is_refused(builtin):
    with pytest.raises(CompileError) as err:
        resolve_address("block_output", 0, None, [16], builtin["llama"][1], None, SITE)
    assert err.value.path == SITE + ("units",)
