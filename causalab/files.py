"""Artifact file names that more than one module writes or reads: constants, one place."""

DOCUMENT = "document.json"
RUN_RECORD = "run.json"
HYDRA_CONFIG = "hydra_config.yaml"
TENSOR_KEY = "weight"
BASIS_KEY = "basis"  # a subspace bundle's orthonormal (d, k) basis, next to its weight
TENSOR_SUFFIX = ".safetensors"
TABLE_SUFFIX = ".json"
RESERVED = (DOCUMENT, RUN_RECORD)
DEFAULT_DATA_ROOT = "documents/data"
DEFAULT_OUT = "out"
SAELENS_CONFIG = "cfg.json"
SAELENS_WEIGHTS = "sae_weights.safetensors"
