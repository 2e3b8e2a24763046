"""What a point run is called in MLflow: its few comparable params and its metric keys.

A reader compares points on what was swept and on a handful of document facts (the model,
the written site, its component, layer and position, the featurizer's kind and rank, the
mechanism, a fit's hyper-parameters); the full document and composed config stay artifacts.
Metric keys put the metric first and the step second (``iia/test``, ``iia/control``): MLflow
lists a run's metrics alphabetically and charts them by the part before the first ``/``, so a
score sits beside its control, in one chart section. The rows a mean was taken over go under
one prefix of their own (``n/iia/test``), which sorts after the scores and charts apart; a
fit's series are ``train/loss`` and ``eval/<metric>`` (docs/platform.md §5). This module sees
only plain data: the lowered point document and its coordinates.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

MAX_PARAMS = 40
COUNT = "n"
SERIES = ("train", "eval")  # a fit's per-update and per-epoch keys start with one of these
MAIN = "iia"  # the quantity a sweep is read by first, where its points have it
CONTROLS = ("control", "random")  # the steps that score a control
BOUNDS = (".lo", ".hi")  # a score's 95 % interval: ``iia/test.lo``, ``iia/test.hi``
SEEDS = ".seeds"  # a parent's summary across swept seeds: ``iia/test.seeds.mean``, ``.sd``, …
_FIT_KEYS = ("epochs", "pairs", "seed", "batch_size")
_OPTIMIZER_KEYS = ("name", "lr", "weight_decay")


def metric_key(step: str, name: str) -> str:
    """``test`` + ``iia`` -> ``iia/test``: one key per (step, metric) pair, metric first."""
    return f"{name}/{step}"


def eligible_key(step: str, name: str) -> str:
    """``n/iia/test``: how many rows the mean of ``iia/test`` was taken over."""
    return f"{COUNT}/{metric_key(step, name)}"


def bound_keys(key: str) -> tuple[str, str]:
    """``iia/test`` -> (``iia/test.lo``, ``iia/test.hi``): its interval's keys, which MLflow's
    alphabetical list puts right after the score."""
    return key + BOUNDS[0], key + BOUNDS[1]


def is_bound(key: str) -> bool:
    """An end of a score's interval (``iia/test.lo``)."""
    return key.endswith(BOUNDS) and is_score(key[:-len(BOUNDS[0])]) and \
        not key[:-len(BOUNDS[0])].endswith(SEEDS)


def is_score(key: str) -> bool:
    """A point's final score (``iia/test``): not a row count, not a fit's series, not an end
    of its interval, not a summary across seeds."""
    parts = key.split("/")
    return (len(parts) == 2 and parts[0] not in (COUNT, *SERIES) and not key.endswith(BOUNDS)
            and f"{SEEDS}." not in parts[1])


def is_count(key: str) -> bool:
    return key.split("/", 1)[0] == COUNT and key.count("/") == 2


def order(key: str) -> tuple:
    """Where a key goes among a run's: scores first (``iia`` first, a test before its
    control, an interval's ends where their score is), then a fit's series, then row counts."""
    if is_bound(key):
        return order(key[:-len(BOUNDS[0])])
    if is_score(key):
        name, step = split_score(key)
        return (0, name != MAIN, name, step in CONTROLS)
    return (2 if is_count(key) else 1, False, "", False)


def listed(key: str) -> tuple:
    """Where a key goes in a table of keys: by :func:`order`, then by name, a score's
    interval ends (low, then high) right after it."""
    if is_bound(key):
        return (order(key), key[:-len(BOUNDS[0])], 1 + BOUNDS.index(key[-len(BOUNDS[0]):]))
    return (order(key), key, 0)


def log_order(metrics: list) -> list:
    """Metric points (``.key`` each) in the order a run logs them (:func:`order`), stably,
    so each key's history keeps its order: MLflow's compare page plots the first logged
    metric against the params by default, and it should be the main score."""
    return sorted(metrics, key=lambda point: order(point.key))


def fits_watched(document: Mapping[str, Any] | None) -> dict[str, str]:
    """Each fit step of a point's document -> the metric its early stop watches (``iia``;
    ``metric`` when none is named): the ``eval/<metric>`` series of its epochs."""
    steps = (document or {}).get("steps", {})
    return {name: step.get("early_stop", {}).get("metric", "metric")
            for name, step in steps.items()
            if isinstance(step, dict) and step.get("kind") == "fit"}


def split_score(key: str) -> tuple[str, str]:
    """``iia/test`` -> (``iia``, ``test``): the metric and the step of a score key."""
    name, _, step = key.partition("/")
    return name, step


def short_model(key: Any) -> str:
    """A model as a run's name says it: a built-in without ``causalab:``, a hub id or a
    folder by its last part.

    >>> [short_model(k) for k in ("causalab:weekday-gpt2", "meta-llama/Llama-3.2-1B", "gpt2")]
    ['weekday-gpt2', 'Llama-3.2-1B', 'gpt2']
    """
    text = _text(key).rstrip("/")
    text = text[len("causalab:"):] if text.startswith("causalab:") else text
    return text.rsplit("/", 1)[-1] or text


def run_label(pairs: Mapping[str, Any]) -> str:
    """Coordinates as a run's name says them, each by its last word, a model by its short
    name, space-separated: what tells a multirun's job apart from the others (``model=gpt2``),
    before its points' own names (``model=gpt2 k=4``).

    >>> run_label({"model": "causalab:weekday-gpt2", "site.layer": 1})
    'model=weekday-gpt2 layer=1'
    """
    words = []
    for key, value in pairs.items():
        word = "model" if key in ("model", "model.key") else str(key).rsplit(".", 1)[-1]
        words.append(f"{word}={short_model(value) if word == 'model' else _text(value)}")
    return " ".join(words)


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _position(pos: Any) -> Any:
    if isinstance(pos, Mapping) and set(pos) <= {"frame", "index"} and "index" in pos:
        return pos["index"]
    return pos


def _joined(values: list[Any]) -> str | None:
    unique: list[str] = []
    for value in values:
        text = _text(value)
        if text not in unique:
            unique.append(text)
    return ",".join(unique) if unique else None


def writes_of(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = []
    for intervention in (document.get("interventions") or {}).values():
        entries = intervention if isinstance(intervention, list) else [intervention]
        for entry in entries:
            if isinstance(entry, Mapping):
                found += [w for w in (entry.get("writes") or {}).values() if isinstance(w, Mapping)]
    return found


def site_facts(document: Mapping[str, Any], writes: list) -> dict[str, str | None]:
    sites = document.get("sites") or {}
    names = [w.get("site") for w in writes if w.get("site") in sites]
    places = [sites[n] for n in dict.fromkeys(names)]
    return {
        "site": _joined(list(dict.fromkeys(names))),
        "component": _joined([s.get("component") for s in places if s.get("component")]),
        "layer": _joined([s["layers"] for s in places if s.get("layers") is not None]),
        "head": _joined([s["heads"] for s in places if s.get("heads") is not None]),
        "position": _joined([_position(w["pos"]) for w in writes if w.get("pos") is not None]),
        "mechanism": _joined([w.get("mechanism") for w in writes if w.get("mechanism")]),
    }


def _featurizer_facts(document: Mapping[str, Any], writes: list) -> dict[str, str | None]:
    featurizers = document.get("featurizers") or {}
    used = [featurizers[w["featurizer"]] for w in writes if w.get("featurizer") in featurizers]
    used = used or list(featurizers.values())
    return {
        "featurizer": _joined([f.get("kind") for f in used if isinstance(f, Mapping)]),
        "k": _joined([f["k"] for f in used if isinstance(f, Mapping) and f.get("k") is not None]),
    }


def _fit_facts(document: Mapping[str, Any]) -> dict[str, str | None]:
    facts: dict[str, str | None] = {}
    for name, step in (document.get("steps") or {}).items():
        if not isinstance(step, Mapping) or step.get("kind") != "fit":
            continue
        for key in _FIT_KEYS:
            facts[f"{name}.{key}"] = _text(step[key]) if step.get(key) is not None else None
        optimizer = step.get("optimizer") or {}
        for key in _OPTIMIZER_KEYS:
            label = "optimizer" if key == "name" else key
            value = optimizer.get(key)
            facts[f"{name}.{label}"] = _text(value) if value is not None else None
    return facts


def point_params(document: Mapping[str, Any] | None, coordinates: Mapping[str, Any],
                 job: Mapping[str, str] | None = None) -> dict[str, str]:
    """At most :data:`MAX_PARAMS` params: swept coordinates, the job's overrides, then facts.

    >>> point_params({"model": {"key": "causalab:tiny-llama"}}, {"k": 4})
    {'k': '4', 'model.key': 'causalab:tiny-llama'}
    """
    document = document or {}
    params = {str(k): _text(v) for k, v in coordinates.items()}
    for key, value in (job or {}).items():
        params.setdefault(str(key), str(value))
    writes = writes_of(document)
    facts: dict[str, str | None] = {"model.key": (document.get("model") or {}).get("key"),
                                    "model.control": (document.get("model") or {}).get("control")}
    facts.update(site_facts(document, writes))
    facts.update(_featurizer_facts(document, writes))
    facts.update(_fit_facts(document))
    for key, value in facts.items():
        if value is not None and len(params) < MAX_PARAMS:
            params.setdefault(key, value)
    return dict(list(params.items())[:MAX_PARAMS])
