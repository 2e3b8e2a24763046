"""Results read back as data: from a run's output folder or from its tracked runs in a store.

``causalab.run`` and its :class:`Result` (:mod:`.result`: DataFrames and tensors for a
notebook), point runs as one table (:mod:`.search`), a store's runs for ``causalab runs``
(:mod:`.listing`) and ``causalab diff`` between two results (:mod:`.diff`). Nothing here
runs an experiment or writes a run: the pipeline runs, tracking logs, this reads. Importing
this package does not import MLflow; the modules that read a store do, when they are used.
"""
from causalab.results.result import Result, read_table, run, search_points

__all__ = ["Result", "read_table", "run", "search_points"]
