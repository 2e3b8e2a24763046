"""The engine room: a compiled plan turned into tensors on an nnterp model.

It takes frozen plan data from ``causalab.compile`` and a loaded model, walks the plan tree
in written order and writes what the plan saves. It never reads a document, a data table
or a Hydra config and never imports mlflow; tracking listens through ``events.Events``.

How one forward runs, and who owns what (docs/engine.md walks one through):

* ``walk`` — the tree walk, ``run_pass``, and ``run_trace``, the only place an nnsight
  trace is opened;
* ``planner`` — every speed decision: which traces run over which rows, resumed where,
  the head over which columns, stopped where, and which sweep points fuse (``TraceJob``s
  in stages, plain data, in ``trace_jobs``);
* ``assembly`` — the pass assembly: each stage's values kept, the ``PassResult``, its
  metric table;
* ``state`` — the typed state all three take (``WalkState``, ``PassContext``, ``Windows``);
* ``taps`` — a job bound to its tensors; ``sites`` — how each vocabulary accessor is
  reached inside a trace (``REACH``); ``seam`` — the one ``gather`` and the one
  ``apply_write``, with ``mechanisms`` and ``featurizers`` the tables it applies;
* ``cache`` — what a document's points share (``DocumentCache``); ``windows`` — resolved
  positions; ``resume`` / ``tail`` / ``generate`` — where a trace may enter, a fit's forward
  at the last column over kept keys, and decoding's generated frame;
* ``metrics``, ``outputs``, ``steps``, ``fit`` — scoring, publishing, the steps around a pass;
* ``weights``, ``record``, ``events`` — model loading, files, listeners; ``featurizers`` —
  every featurizer kind, ``bundle_files`` their stamped tensor files;
  ``attribution`` — gradient patching, AtP*'s corrections, ``verify``, edges (EAP-IG);
  ``budget`` — the memory budget as the planner spends it (each trace's estimated peak);
  ``traces`` — the schedule of a document without its weights (``explain --traces``);
  ``fidelity`` — the receipt that the engine's no-op forward is the plain model.

The pipeline (``causalab.pipeline``, the CLI, ``run``, ``tracking``) may use only:
``walk.run_plan``, ``walk.prefetch``, ``walk.discard_prefetched``,
``cache.DocumentCache``, ``planner.groups``, ``planner.alike_later``, ``weights.load_model``, ``weights.served_dtype``,
``weights.measure_budget``, ``weights.budget_of`` (the memory budget, measured before the model loads),
``record.write_json``, ``record.write_run_record``, ``events.Events``, ``events.Chain``,
``containment.check_plan``, ``containment.inside`` (writes stay under ``--out``),
``bundle_files.check_plan_bundles`` (no NaN or Inf in a bundle file, before anything is written)
``bundle_files.restamp`` (``causalab restamp``, an intended edit's new digest),
``featurizers.subspace.export_basis`` (``causalab fetch --basis``),
``fidelity.receipt`` (the no-op forward against plain transformers, before the points) and
``traces.explain_traces`` (``causalab explain --traces``).
Nothing is imported here, so importing the room loads no torch.
"""
