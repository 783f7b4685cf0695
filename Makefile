# The targets the README's two commands call, plus the notebooks' sync. Everything installs into .venv.
#
# Install order: torch==2.13.0 first (a CPU build on our machines' local disk; pyproject.toml keeps a range), then
# lazylab in editable mode with the test, dashboard, postgres, docs and slurm extras (postgres: the PostgreSQL driver
# the sweep tests use; docs: MkDocs and its plugins, for `make docs` and tests/docs; slurm: submitit, for --slurm and
# tests/slurm), then the labml_nn reference the tests and benchmarks compare against. labml_nn 0.5.1 goes in with
# --no-deps on purpose: its requirements would also bring torchtext, torchvision and fairscale, which the modules we
# compare against do not import; what they do need (labml, einops) is in lazylab's dependencies and test extra. This
# is the one place that installs it (CONTRIBUTING.md points here).
# fla-core 0.6.0 (flash-linear-attention's ops) is a TEST REFERENCE ONLY, also with --no-deps: the tests and
# benchmarks of the gated delta rule and DeltaProduct compare against three of its pure-PyTorch functions, loaded by
# file path (lazylab/models/fast_weights/fla_reference.py), so that its Triton kernels are never imported or needed;
# lazylab itself never imports it. Its only other requirement, einops, is in the test extra.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[test,dashboard,postgres,docs,slurm]'
	$(PIP) install --no-deps labml-nn==0.5.1
	$(PIP) install --no-deps fla-core==0.6.0
	$(PY) lazylab/dashboard/assets.py   # the dashboard page's d3 and Bootstrap CSS, pinned by sha256 (not in git)
	touch $@

.PHONY: install train test lint docs notebooks
install: $(VENV)/.installed

train: $(VENV)/.installed
	$(VENV)/bin/lazylab train feedback

# Two workers (pytest-xdist): most of the slow tests wait on the processes they start (trials, torchrun, servers),
# so two workers on a 2-core machine take 2.4x less time than one (the sweeps and docs tests: 244 s against 595 s).
# TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 2
test: $(VENV)/.installed
	$(PY) -m pytest -q -n $(TEST_WORKERS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache   # the architecture contracts in pyproject.toml
	$(MAKE) --no-print-directory docs

# The documentation site into site/, strictly: a broken link, a missing anchor or an unresolved reference fails the
# build (not --quiet: it hides the warnings from --strict too). The two variables silence the banners Material and
# mkdocs-gen-files print about MkDocs 2.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict

# After editing a notebook's .py source (its source of truth): rewrite the paired .ipynb (inputs only, no outputs).
notebooks: $(VENV)/.installed
	$(VENV)/bin/jupytext --sync notebooks/*.py
