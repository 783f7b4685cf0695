# Two entry points, used by the README and CI. Everything installs into .venv.
# torch==2.13.0 is pinned here (a CPU build available offline on our machines); setup.py keeps a range.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

$(VENV)/.installed: setup.py
	python3 -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[test,dashboard]'
	$(PIP) install --no-deps labml-nn==0.5.1   # the reference implementation the tests compare against
	touch $@

.PHONY: install train test
install: $(VENV)/.installed

train: $(VENV)/.installed
	$(VENV)/bin/lazylab train feedback

test: $(VENV)/.installed
	$(PY) -m pytest -q
