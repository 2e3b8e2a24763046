"""The engine room: a compiled plan turned into tensors on an nnterp model.

It takes frozen plan data from ``causalab.compile`` and a loaded model, walks the plan tree
in written order and writes what the plan saves. It never reads a document, a data table
or a Hydra config and never imports mlflow; tracking listens through ``events.Events``.

How one forward runs, and who owns what:

* ``walk`` — the tree walk and the only place an nnsight trace is opened (``WalkState``);
* ``cache`` — what a document's points share (``DocumentCache``);
* ``taps`` — each read or write of a trace with its window (``PreparedTap``);
* ``sites`` — how each vocabulary accessor is reached inside a trace (``REACH``);
* ``seam`` — the one ``gather`` and the one ``apply_write``; ``mechanisms`` and
  ``featurizers`` are the tables it applies;
* ``passes`` — a pass's result (``PassResult``); ``metrics`` scores it, ``outputs``
  publishes it, ``steps`` and ``fit`` run the steps around it;
* ``fusion`` — which sweep points share one trace, and their lockstep run;
* ``resume`` / ``tail`` — where a trace enters from kept values, and a fit's forward at
  the last position alone over kept keys and values;
* ``decoding`` / ``generate`` — decoding forwards and their generated frame;
* ``forwards`` / ``windows`` — input tensors, cache keys and resolved positions;
* ``load``, ``record``, ``bundles``, ``events`` — model loading, files, stamps, listeners.

The pipeline (``causalab.pipeline``, the CLI, ``run``, ``tracking``) may use only:
``walk.run_plan``, ``walk.prefetch``, ``walk.discard_prefetched``,
``cache.DocumentCache``, ``fusion.groups``, ``fusion.alike_later``, ``load.load_model``, ``load.served_dtype``,
``record.write_json``, ``record.write_run_record``, ``events.Events``, ``events.Chain``,
``containment.check_plan``, ``containment.inside`` (writes stay under ``--out``),
``bundles.check_plan_bundles`` (no NaN or Inf in a bundle file, before anything is written)
``bundles.restamp`` (``causalab restamp``, an intended edit's new digest)
and ``featurizers.subspace.export_basis`` (``causalab fetch --basis``).
Nothing is imported here, so importing the room loads no torch.
"""
