"""Featurizer files checked before a run: stamps, digests, SAELens directories (their tensors are read and written by causalab.engine.bundle_files)."""
