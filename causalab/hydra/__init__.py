"""Hydra around the document: rendering a composed config, the multirun parent, its jobs."""
