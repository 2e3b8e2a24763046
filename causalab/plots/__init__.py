"""Pictures: PNGs of sweeps, rankings, attribution maps and faithfulness, on one canvas."""
