"""A sweep's scores as plain numbers: their names, their order and ties, their spread over seeds.

What a point is called (its few comparable params and its metric keys, :mod:`.naming`), its
stored metrics read as quantities measured by steps and the sweep's table (:mod:`.summary`),
which points come first and which are tied (:mod:`.ranking`), and how much a score moves with
the seed alone (:mod:`.seeds`). Plain data in, plain data out: no store, no model, no
picture. Tracking logs these, the plots draw them, a sweep's parent lands them.
"""
