"""causalab's Hydra launcher plugins (Hydra takes launchers only from the ``hydra_plugins`` package)."""
