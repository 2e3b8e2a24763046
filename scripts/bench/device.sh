#!/usr/bin/env bash
# The first GPU run, prepared: on one accelerator whose Python has torch, transformers and the
# common scientific packages but none of causalab's other dependencies and no network.
#
#   scripts/bench/device.sh              # installs ./wheels, runs the engine tests on CUDA, then the 8B shape
#   scripts/bench/device.sh --dry        # the same steps on the CPU: the repo's venv, a small shape, no install
#
# 1. installs causalab's missing dependencies from the wheels beside it (WHEELS, default
#    scripts/bench/wheels/, git-ignored, at most 64 MiB) into a folder on PYTHONPATH, with the
#    repository itself;
# 2. runs the engine's hook-oracle and byte-identity tests with CAUSALAB_TEST_DEVICE=cuda
#    (the engine's models on the accelerator, the hand-written oracles on the CPU);
# 3. runs scripts/bench/device.py: the Llama-3.1-8B stand-in in bf16, a head sweep, a DAS fit
#    and attribution against hand-written hooks on the same device, peak memory against the
#    budget, and a final table.
# Whole run within 8 minutes on one H200; each step has its own time limit.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DRY=0
[ "${1:-}" = "--dry" ] && DRY=1
WHEELS="${WHEELS:-$HERE/wheels}"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false \
       MLFLOW_DISABLE_TELEMETRY=true OMP_WAIT_POLICY=PASSIVE
export CAUSALAB_HOME="${CAUSALAB_HOME:-$(mktemp -d /tmp/causalab-device.XXXXXX)}"
# The hook-oracle and byte-identity tests whose causalab side is compared as written tables or
# with itself (test_walk.py and test_last_column_head.py hold the engine's tensors against
# CPU tensors directly, so they stay on the CPU).
TESTS="tests/engine/test_batching.py tests/engine/test_fusion.py tests/engine/test_resume.py
       tests/engine/test_attribution.py tests/engine/test_growth.py
       tests/engine/test_memory_budget.py tests/engine/test_known_answers.py"

if [ "$DRY" = 1 ]; then
    PY="${PYTHON:-$ROOT/.venv/bin/python}"
    DEVICE=cpu
    TESTS="tests/engine/test_batching.py"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
    PY="${PYTHON:-python3}"
    DEVICE=cuda
    SITE="${SITE:-/tmp/causalab-site}"
    mkdir -p "$SITE"
    if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl || exit 1
    else
        echo "device.sh: no wheels in $WHEELS (see scripts/bench/wheels.txt)" >&2
        exit 1
    fi
    export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
cd "$ROOT" || exit 1
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

start=$(date +%s)
# shellcheck disable=SC2086
CAUSALAB_TEST_DEVICE=$DEVICE timeout "${TESTS_TIMEOUT:-300}" "$PY" -m pytest -q -p no:cacheprovider -m "not slow" \
    $TESTS > "$CAUSALAB_HOME/tests.log" 2>&1
tests_status=$?
tests_line="$(tail -n 1 "$CAUSALAB_HOME/tests.log")"
tests_seconds=$(( $(date +%s) - start ))
[ $tests_status -ne 0 ] && grep -E "^(FAILED|ERROR)" "$CAUSALAB_HOME/tests.log" | head -20

start=$(date +%s)
if [ "$DRY" = 1 ]; then
    timeout 240 "$PY" scripts/bench/device.py --dry > "$CAUSALAB_HOME/device.log" 2>&1
else
    timeout "${BENCH_TIMEOUT:-330}" "$PY" scripts/bench/device.py --device cuda --memory "${MEMORY:-80%}" \
        > "$CAUSALAB_HOME/device.log" 2>&1
fi
device_status=$?
device_seconds=$(( $(date +%s) - start ))
[ $device_status -ne 0 ] && tail -n 20 "$CAUSALAB_HOME/device.log"

echo
echo "device.sh $(date -u +%Y-%m-%d) on $DEVICE"
printf '%-22s %s\n' "engine tests ($DEVICE)" "$tests_line (${tests_seconds} s, status $tests_status)"
sed -n '/^$/,$p' "$CAUSALAB_HOME/device.log" | sed '1d'
printf '%-22s %s\n' "bench" "${device_seconds} s, status $device_status"
[ $tests_status -eq 0 ] && [ $device_status -eq 0 ]
