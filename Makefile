# Two commands set everything up on a fresh machine:
#   make reproduce   - create .venv, install pinned packages, run the whole pipeline on CPU (quick preset)
#   make test        - create .venv, install pinned packages, run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-v4

.PHONY: reproduce test setup clean

$(STAMP): setup.py requirements.txt constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -r requirements.txt
	# TorchRec (baseline) without its dependency on the CUDA fbgemm-gpu; torch stays pinned
	$(PY) -m pip install -q --no-deps torchrec==1.9.2
	$(PY) -m pip install -q -c constraints.txt tensordict torchmetrics==1.0.3 iopath pyre-extensions \
		typing-inspect lightning-utilities
	# MovieLens-100K ships inside recbole's wheel; only its data files are read (never imported)
	$(PY) -m pip install -q --no-deps recbole==1.2.1
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

reproduce: $(STAMP)
	$(PY) tools/run_pipeline.py --preset quick

# two pytest-xdist workers, each test module's tests on one of them (its module fixtures built once)
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadscope tests

clean:
	rm -rf $(VENV) data models results
