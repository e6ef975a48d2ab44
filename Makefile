# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# TORCH_SPEC selects the torch installed first (default torch==2.13.0; which build pip picks
# depends on the configured index: the development machines resolve it to a local CPU wheel).
# GPU users: point pip at their CUDA wheels; any torch in the range in pyproject.toml works.
# Another torch build in its own environment: make test VENV=.venv-torch215 TORCH_SPEC="torch==2.15.*"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-gpu install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check src tests benchmarks experiments examples mkdocs_hooks.py
	$(PY) -m ruff format --check src tests benchmarks experiments examples mkdocs_hooks.py
	$(PY) -m mypy
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
	$(PY) -m pytest -n 2 -q

demo: $(STAMP)
	$(PY) -m hrope.nvs.demo

bench: $(STAMP)
	$(PY) benchmarks/attention_overhead.py --threads 1
	$(PY) benchmarks/attention_overhead.py --threads 1 --malloc-cache
	$(PY) benchmarks/attention_overhead.py --threads 1 --warm-allocator 16
	for state in "" --malloc-cache "--warm-allocator 16"; do \
	  $(PY) benchmarks/attention_overhead.py --threads 1 --reps 30 --encodings prope hrope hrope-lift prope-einsum \
	    --out benchmarks/results/targets $$state || exit 1; done
	$(PY) benchmarks/attention_overhead.py --threads 1 --prepared-once
	$(PY) benchmarks/attention_overhead.py --threads 1 --prepared-once --warm-allocator 16
	$(PY) benchmarks/query_frame_scaling.py --variants --threads 1
	$(PY) benchmarks/render_speed.py --threads 1
	$(PY) benchmarks/train_throughput.py
	$(PY) benchmarks/compile_speed.py --threads 1
	$(PY) benchmarks/real_loading.py

bench-gpu: $(STAMP)  # on a CUDA machine, with a CUDA build of torch (TORCH_SPEC); at most ten minutes
	$(PY) benchmarks/gpu_suite.py

clean:
	rm -rf $(VENV) runs .pytest_cache site
