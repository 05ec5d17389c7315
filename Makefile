# Two commands run the project on a fresh clone:  make lab   and   make test
# Each creates the virtual environment (.venv) if it is missing and installs the
# pinned versions from constraints.txt.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 8888

# Bytecode caches, kept inside the venv. Where the environment sets PYTHONDONTWRITEBYTECODE (some
# containers do), every kernel nbval starts compiles torch's Python sources again (torch._dynamo
# alone: about 11 s per notebook measured on 2 cores); an empty value turns the setting off.
export PYTHONDONTWRITEBYTECODE :=
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache

# papermill report parameters (make report ACCUM="1 2 4 8" NORM=group). Every k must give at
# least 3 optimizer steps (the report refuses otherwise): micro-batches of 3 do so at k = 8 for
# every built-in task (mlp-digits: 37 micro-batches, 5 steps; lm-tokens: 22, 3 steps).
ACCUM     ?= 1 2 4 8
TASK      ?= mlp-digits
BATCH     ?= 3
NORM      ?= group
PRECISION ?= float32
DEVICE    ?= auto
SEED      ?= 0

.PHONY: install lab test durations lint typecheck format notebooks lesson-data selfcheck docs report bench survey gpu-check clean

install: $(STAMP)

# uv resolves and downloads in parallel (about 1 minute instead of about 9 with pip);
# it is bootstrapped with pip at its pinned version. uv does not read pip's config, so
# a find-links location configured for pip (a local wheel of torch) is passed on.
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt uv
	$(VENV)/bin/uv pip install --python $(PY) -c constraints.txt -e ".[dev]" $(addprefix --find-links ,$(FIND_LINKS))
	touch $(STAMP)

# JupyterLab on notebooks/. Without a display it only serves and prints the URL
# (containers often run as root, which JupyterLab refuses unless told). binder/overrides.json, the
# defaults Binder's postBuild installs too, goes where JupyterLab reads it: closing a notebook's tab
# shuts its kernel down (tests/test_browser_kernels.py).
lab: $(STAMP)
	mkdir -p $(VENV)/share/jupyter/lab/settings && cp binder/overrides.json $(VENV)/share/jupyter/lab/settings/
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --port=$(PORT) $(if $(DISPLAY),,--no-browser) $(if $(filter 0,$(shell id -u)),--allow-root)

# Every test: unit and property tests, nbval over every notebook, the browser tests. Test files are
# spread over TEST_WORKERS processes (pytest-xdist; a file stays in one worker, so its shared runs and
# launches are made once; tests/_schedule.py); TEST_WORKERS=0 runs them in this process, one after another.
# 3 on CI's 2 cores: the tests wait on processes, kernels and pages often enough that a third worker fills
# the gaps (a fresh clone's .ci/run on 2 AMD EPYC cores: 2 workers 13 min 59 s at 153% CPU, 3 workers 12 min
# 4 s at 167%, 4 workers slower than 3: docs/development.md).
# ruff and mypy run first (settings in pyproject.toml: line length 110, import order; the public names as mypy
# sees them): a formatting, lint or typing finding fails the run before the tests' minutes.
TEST_WORKERS ?= 3
test: $(STAMP) lint
	$(PY) -m pytest -p no:cacheprovider $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# Each test's seconds from one whole run (as make test runs it), into tests/durations.json, the table make
# test's two workers start the longest units first by (tests/_schedule.py); prints the slowest 20 tests, the
# table docs/development.md shows. Rerun it when a test file's time changes a lot.
durations: $(STAMP)
	ACCUMLIB_DURATIONS=$(abspath $(VENV))/test-seconds.json $(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile
	$(PY) tools/durations.py $(VENV)/test-seconds.json

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(MAKE) --no-print-directory typecheck

# mypy on the public names (tools/public_names.py): every name of accumlib.__all__ must be one mypy sees,
# not Any, a reference loop as its function. About 25-40 s on 2 cores while mypy's cache is cold (it reads
# torch's annotations), 2-3 s after: the cache lives in the venv.
# Then mypy --strict on accumlib/_verify, module by module (issue 47): every module there but those of
# VERIFY_NOT_STRICT, which still have strict errors (inplace.py, watch.py, sources.py; losscalls.py, being
# reworked); --follow-imports=silent keeps their errors out where a listed module imports them. Its own
# cache: one shared with the run above, under other flags, is rebuilt by each (about 20 s every time).
VERIFY_NOT_STRICT := inplace.py watch.py sources.py losscalls.py
VERIFY_STRICT = $(filter-out $(addprefix accumlib/_verify/,$(VERIFY_NOT_STRICT)),$(wildcard accumlib/_verify/*.py))
typecheck: $(STAMP)
	$(PY) tools/public_names.py --cache-dir $(VENV)/mypy_cache
	$(PY) -m mypy --strict --follow-imports=silent --cache-dir $(VENV)/mypy_cache_strict $(VERIFY_STRICT)

# What `make lint` checks, fixed where ruff can (formatting, import order, unused imports).
format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Re-run notebooks top to bottom and save their outputs in place, as they are committed: every notebook,
# or those whose name starts with NB (make notebooks NB=07; NB="02 07" for two). report.ipynb runs with its
# default parameters. After a change to a lesson module or a notebook, commit what this writes.
NB ?=
NOTEBOOKS = $(if $(strip $(NB)),$(foreach n,$(NB),$(wildcard notebooks/$(n)*.ipynb)),$(wildcard notebooks/*.ipynb))
notebooks: $(STAMP)
	@test -n "$(strip $(NOTEBOOKS))" || { echo "make notebooks: no notebook in notebooks/ starts with NB=$(NB)" >&2; exit 2; }
	$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=600 $(NOTEBOOKS)

# Lesson 10's recorded run of the small GPT (300 steps, seven runs: 5 to 10 minutes on 2 cores), which the
# notebook shows and the tests check against a fresh computation of its first steps. After a change to
# accumlib_course/lessons/_your_own_project_gpt.py's training, run this, then make notebooks NB=10.
lesson-data: $(STAMP)
	$(PY) -m accumlib_course.lessons._your_own_project_gpt

selfcheck: $(STAMP)
	$(VENV)/bin/accumlib selfcheck

# Figures, not tests: memory and time of accumulation, every goal of issue 7 stated as met or
# MISSED; writes benchmarks/results/latest.{json,md,png} (under 10 minutes on 2 cores).
# ONLY=memory,price runs those sections and keeps the others' last figures (bench.py --only ... --merge).
bench: $(STAMP)
	$(PY) benchmarks/bench.py $(if $(ONLY),--only $(ONLY) --merge)

# Every causal-LM class and every sequence classifier of the pinned transformers, one Trainer
# epoch each under verify_trainer: writes surveys/transformers-<version>[-sequence-classification].{md,json}
# (about 3 minutes on 2 cores).
survey: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/python -m accumlib_course.survey transformers --out surveys > /dev/null
	OMP_NUM_THREADS=1 $(VENV)/bin/python -m accumlib_course.survey transformers --task sequence-classification --out surveys > /dev/null
	cp surveys/transformers-*.json accumlib_course/survey/tables/  # the tables the package ships (lesson 9 loads them by version)

# The papermill report for the parameters above, in REPORT_DIR: report.ipynb (executed by papermill),
# report.json (every number) and report.html (nbconvert): what a person reads, the outputs only, with no
# code, no In[] prompts and neither parameters cell, the parameters shown once as the report's own table,
# figures embedded with alt text. accumlib_course/report/render.py says how; MPLBACKEND=Agg: no display needed.
REPORT_DIR ?= reports
report: $(STAMP)
	MPLBACKEND=Agg $(PY) -m accumlib_course.report.render notebooks/report.ipynb "$(REPORT_DIR)" \
		-p task "$(TASK)" -p accum_steps "$(ACCUM)" -p batch_size "$(BATCH)" -p norm "$(NORM)" \
		-p precision "$(PRECISION)" -p device "$(DEVICE)" -p seed "$(SEED)" -p results_path "$(REPORT_DIR)/report.json"

# The verifier notebook (7) as a Voila app: a page where participants paste a loop and read
# the verdict (code cells hidden). Share it on a workshop network with APP_IP=0.0.0.0.
APP_IP ?= 127.0.0.1
.PHONY: app
app: $(STAMP)
	$(VENV)/bin/voila notebooks/07_verify_your_loop.ipynb --Voila.ip=$(APP_IP) --port=$(PORT) $(if $(DISPLAY),,--no-browser)

# Binder, reproduced without Docker (tools/binder_check.py): repo2docker's base environment for
# binder/runtime.txt's Python (its lock file) in a fresh venv, then binder/requirements.txt and binder/postBuild
# as repo2docker runs them, `pip check` clean, JupyterLab from that venv with the course map opened and run in
# headless Chromium. It downloads from PyPI, so it is not part of `make test` (CI has no internet).
.PHONY: binder-check
binder-check: $(STAMP)
	$(PY) tools/binder_check.py

# Mutation testing (tools/mutate.py): each mutant of tools/mutants/ (an operator on the syntax tree, applied
# to the one node its code names) in a private copy of the tree, its killers first, then its group's tests;
# the score per module in tools/mutation.md. Hours on 2 cores, so not part of `make test` or CI; GROUPS=hf
# runs some groups, ONLY='num_items' the mutants whose name contains it (not recorded).
.PHONY: mutation
mutation: $(STAMP)
	$(PY) tools/mutate.py $(GROUPS) $(if $(ONLY),--only '$(ONLY)')

# The GPU check (tools/gpu_check.py): the reference table, every lesson's computations, mixed precision
# under verify and verify at GPT-2-small size, on CUDA (under 5 minutes on one H100), figures in GPU_OUT.
# No venv needed: .venv's python when there is one, else $(PYTHON), or the one named (make gpu-check
# PY=python on a GPU machine's own image). DRY=1 rehearses it on the CPU. Exit 3: no CUDA device;
# 4: checks skipped (a package missing).
GPU_OUT ?= reports/gpu-check
GPU_PY = $(if $(filter command line,$(origin PY))$(wildcard $(PY)),$(PY),$(PYTHON))
gpu-check:
	PYTHONPATH=. $(GPU_PY) tools/gpu_check.py --out "$(GPU_OUT)" $(if $(DRY),--dry-run)

# The documentation site in DOCS_OUT/site (open DOCS_OUT/site/index.html): the README, docs/, the notebooks
# with their committed outputs and the API reference from docstrings (tools/docs.py says how). Its
# toolchain (MkDocs, mkdocs-jupyter, mkdocstrings) lives in its own venv, .venv-docs, at the pins of
# docs/requirements.txt: mkdocs-jupyter brings jupytext, whose JupyterLab extension must stay out of the
# course's lab. tests/test_docs_site.py builds it and opens every page in Chromium.
DOCS_OUT  ?= build/docs
DOCS_VENV ?= .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed-stamp
$(DOCS_STAMP): docs/requirements.txt $(STAMP)
	$(VENV)/bin/uv venv -q --allow-existing --python $(PY) $(DOCS_VENV)
	$(VENV)/bin/uv pip install -q --python $(DOCS_VENV)/bin/python -r docs/requirements.txt
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(DOCS_VENV)/bin/python tools/docs.py --out "$(DOCS_OUT)"

clean:
	rm -rf $(VENV) reports .pytest_cache .hypothesis $(DOCS_VENV) build
