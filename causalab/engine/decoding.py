"""Decoding forwards (docs/format.md §11): N traced steps per window of rows over one KV cache.

It runs a decoding forward through the ``trace`` the walk hands it (the walk is the only
place a trace is opened) and cuts generated-frame reads once the continuation is known;
which taps act at which step is ``causalab.engine.generate``'s plan-data business.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from causalab.compile.plan import Forward, Pass, ReadOp
from causalab.engine import forwards, generate
from causalab.engine import outputs as output_rules
from causalab.engine import windows as window_rules
from causalab.engine.seam import Window
from causalab.engine.taps import prepare


def run_decode(model: Any, pass_: Pass, forward: Forward, state: Any, run_rows: tuple,
               resolved: dict, values: dict, trace: Callable) -> dict:
    """A greedy decode of ``forward.decode`` tokens per window of rows: raw reads (their
    generated-frame ones stacked per step, still uncut) and the ids under ``GENERATED``."""
    local = {row: i for i, row in enumerate(run_rows)}
    pieces: dict[str, list] = {read.name: [] for read in forward.reads}
    tokens = []
    for chunk in forwards.chunks(run_rows, state.batch_size):
        per_step, ids = _decode_chunk(model, pass_, forward, state, chunk, resolved, values,
                                      local, trace)
        tokens.append(ids)
        for read in forward.reads:
            pieces[read.name].append(_step_value(pass_, read, per_step, forward.decode))
    out = forwards.gathered(pass_, forward, run_rows, resolved, pieces)
    out[generate.GENERATED] = output_rules.Published(torch.cat(tokens, 0), None, len(run_rows), "none")
    return out


def _step_value(pass_: Pass, read: ReadOp, per_step: list, decode: int) -> torch.Tensor:
    """A read's value over a chunk: its one step, or every step stacked for a later cut."""
    if read.pos.frame != "generated":
        return per_step[0][read.name]
    k = generate.fixed_step(read.pos)
    if k is not None:
        return per_step[k][read.name]
    where = ("interventions", pass_.intervention, "reads", read.name, "pos")
    return generate.stack([per_step[s][read.name] for s in range(decode)], where)


def _decode_chunk(model: Any, pass_: Pass, forward: Forward, state: Any, chunk: tuple,
                  resolved: dict, values: dict, local: dict,
                  trace: Callable) -> tuple[list, torch.Tensor]:
    """N traced steps over one KV cache: the prefill, then one generated token per step.

    Each step feeds the argmax of the logits the previous step's writes left; the cache
    carries every earlier step's writes forward, as a cached decode does.
    """
    inputs, position_ids = forwards.prompt_inputs(model, pass_.inputs[forward.input], chunk,
                                                  state.cache.inputs)
    cache = forwards.kv_cache(model)
    per_step, tokens = [], []
    for step in range(forward.decode):
        taps = generate.step_taps(forward, step)
        last = inputs["input_ids"].shape[1] - 1
        prepared = prepare(pass_, forward, state, chunk, resolved, values, local, taps, last)
        got = trace(model, inputs, position_ids, taps, prepared, cache, next_token=True)
        token = got.pop(generate.GENERATED)
        per_step.append(got)
        tokens.append(token)
        mask = inputs["attention_mask"]
        inputs = {"input_ids": token[:, None],
                  "attention_mask": torch.cat([mask, torch.ones_like(mask[:, :1])], 1)}
        position_ids = position_ids[:, -1:] + 1
    return per_step, torch.stack(tokens, 1).to(torch.int64)


def cut_generated(model: Any, pass_: Pass, forward: Forward, raw: dict, ids: torch.Tensor,
                  run_rows: tuple, resolved: dict) -> dict:
    """Resolve each generated-frame read on the continuation and cut its stacked steps."""
    decode_text = window_rules.decoder(model)
    stops = generate.eos_ids(model)
    batch = pass_.inputs[forward.input]
    cut = dict(raw)
    for read in forward.reads:
        if read.pos.frame != "generated":
            continue
        where = ("interventions", pass_.intervention, "reads", read.name)
        found = generate.resolve_rows(read.pos, batch, run_rows, ids, decode_text, stops, where)
        key = ("read", read.name, forward.input)
        windows, reasons = (list(part) for part in resolved[key])
        for row, (window, reason) in zip(run_rows, found):
            windows[row], reasons[row] = window, reason
        resolved[key] = (tuple(windows), tuple(reasons))
        resolved[("provenance", read.name, forward.input)] = generate.provenance(
            [(windows[r], reasons[r]) for r in run_rows], ids, decode_text)
        if generate.fixed_step(read.pos) is None:
            value = generate.cut(raw[read.name].value, [w for w, _ in found], read.pos.ragged)
            counts = Window.from_windows([w for w, _ in found], ragged=read.pos.ragged).flat_counts
            cut[read.name] = output_rules.Published(value, counts, len(run_rows), "none")
    return cut
