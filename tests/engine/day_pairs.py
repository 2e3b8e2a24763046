"""Weekday pairs whose four prompts are all 8 tokens on the tiny Llama: no padding, equal RoPE
positions, so integrated gradients can walk between base and counterfactual."""

EQUAL_PAIRS = [
    ("If today is Monday, tomorrow is", "If today is Friday, tomorrow is", " Tuesday", " Saturday"),
    ("If today is Friday, tomorrow is", "If today is Wednesday, tomorrow is", " Saturday",
     " Thursday"),
    ("If today is Wednesday, tomorrow is", "If today is Monday, tomorrow is", " Thursday",
     " Tuesday"),
]
