"""Attribution: gradient patching, AtP*'s corrections, verification, edges (EAP-IG)."""
