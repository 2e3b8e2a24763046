"""The engine room: a compiled plan turned into tensors on an nnterp model.

It takes frozen plan data from ``causalab.compile`` and a loaded model, walks the plan tree
in written order and writes what the plan saves. It never reads a document, a data table
or a Hydra config and never imports mlflow; tracking listens through ``events.Events``.

How one forward runs, and who owns what (docs/engine.md walks one through):

* ``entry`` — the one entry of a run (``run_document``) and the walk over a document's
  points (``walk_points``); ``walk`` — the tree walk and ``pass_on``, through a runner;
* ``runner`` — the ``Runner`` the walk runs through, and ``TraceRunner`` with ``run_trace``,
  the only place an nnsight trace is opened; ``dry_run`` — ``DryRunner``, the same walk
  listing the jobs it would open without weights (``explain --traces``);
* ``planner`` — every speed decision: which traces run over which rows, resumed where,
  the head over which columns, stopped where, and which sweep points fuse (``TraceJob``s
  in stages, plain data, in ``jobs``);
* ``passes`` — the pass assembly: each stage's values kept, the ``PassResult``, its
  metric table;
* ``state`` — the typed state all three take (``WalkState``, ``PassContext``, ``Windows``);
* ``taps`` — a job bound to its tensors; ``sites`` — how each vocabulary accessor is
  reached inside a trace (``REACH``); ``seam`` — the one ``gather`` and the one
  ``apply_write``, with ``mechanisms`` and ``featurizers`` the tables it applies;
* ``cache`` — what a document's points share (``DocumentCache``); ``windows`` — resolved
  positions; ``resume`` / ``tail`` / ``generate`` — where a trace may enter, a fit's forward
  at the last column over kept keys, and decoding's generated frame;
* ``metrics``, ``outputs``, ``steps``, ``fit`` — scoring, publishing, the steps around a pass;
* ``load``, ``record``, ``bundles``, ``events`` — model loading, files, stamps, listeners;
  ``budget`` — the memory budget as the planner spends it (each trace's estimated peak);
  ``fidelity`` — the receipt that the engine's no-op forward is the plain model.

Every module outside the rooms (the pipeline, the CLI, Hydra, tracking, plots) may use only:
``entry.run_document`` (a run: checks, the model loaded, the receipt, every point walked),
``entry.points_of``, ``events.Events``, ``events.Chain``, ``weights.load_model``,
``record.write_json``, ``containment.inside`` (writes stay under ``--out``),
``bundle_files.restamp`` (``causalab restamp``, an intended edit's new digest),
``featurizers.subspace.export_basis`` (``causalab fetch --basis``),
``dry_run.explain_traces`` (``causalab explain --traces``).
Nothing is imported here, so importing the room loads no torch.
"""
