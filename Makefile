# Two commands run the project on a fresh clone:  make lab   and   make test
# Each creates the virtual environment (.venv) if it is missing and installs the
# pinned versions from constraints.txt.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 8888

# papermill report parameters (make report ACCUM="1 2 4 8" NORM=group)
ACCUM     ?= 1 2 4 8
TASK      ?= mlp-digits
BATCH     ?= 16
NORM      ?= group
PRECISION ?= float32
DEVICE    ?= auto
SEED      ?= 0

.PHONY: install lab test verify report bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

# JupyterLab on notebooks/. Without a display it only serves and prints the URL.
lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --port=$(PORT) $(if $(DISPLAY),,--no-browser)

# Every test: unit and property tests, then nbval over every notebook.
test: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider

verify: $(STAMP)
	$(VENV)/bin/accumlib verify

clean:
	rm -rf $(VENV) reports .pytest_cache .hypothesis
