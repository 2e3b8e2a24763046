"""Suite-wide settings: no hub, no telemetry, quiet progress bars, a private model cache."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CAUSALAB_QUIET", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
