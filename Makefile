# The README's two commands: `make lab` (the lab's main job) and `make test` (the suite).
# Both create .venv when it is missing and install everything first, with libseccomp for the
# sandbox's system-call filter when it is missing (.ci/ensure-libseccomp); `make test` also
# installs Debian's Chromium for the browser tests when it is missing (.ci/ensure-chromium).
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: record-experiment lab test test-setup system-packages test-record test-fast test-fast-record chromium libseccomp install verl-extra jupyter bench clean-venv

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# torch first, with pip, from the CPU wheel on this machine's disk, so nothing pulls a CUDA
# build; constraints.txt keeps it pinned for every later install. The rest with uv, which
# installs the same packages as pip in half the time (it downloads and unpacks in parallel);
# it keeps the installed torch, which satisfies the constraint. Bytecode is compiled once
# here, the lab's own too: where PYTHONDONTWRITEBYTECODE is set (CI machines), every process
# would otherwise compile what it imports (importing the trainer: 5 s instead of 3.3 s).
UV := $(VENV)/bin/uv
$(STAMP): $(VENV)/bin/python pyproject.toml constraints.txt
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0 'uv>=0.9,<1'
	$(UV) pip install -q --compile-bytecode --python $(PY) --constraint constraints.txt -e '.[dev,trackers]'
	$(PY) -m compileall -q labkit widgets
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(PIP) check
	touch $(STAMP)

install: libseccomp $(STAMP)

# verl (optional, for the scale-out checks): its packages without their dependencies, in a
# folder beside the virtualenv that only the verl adapter's checks put on PYTHONPATH, so the
# lab's own environment (and `pip check`) is unchanged. See docs/scale_out.md.
VERL_DIR   := $(VENV)/verl
VERL_STAMP := $(VERL_DIR)/.installed
$(VERL_STAMP): $(STAMP) requirements-verl.txt
	rm -rf $(VERL_DIR)
	$(UV) pip install -q --python $(PY) --no-deps --target $(VERL_DIR) -r requirements-verl.txt
	touch $(VERL_STAMP)

verl-extra: $(VERL_STAMP)

lab: libseccomp $(STAMP)
	$(PY) -m labkit lab $(LAB_ARGS)

# A missing browser that cannot be installed stops `make test` with one line saying what to run
# (.ci/ensure-chromium).
# Two pytest workers (pytest-xdist), one per core: the tests that share the smoke lab or the
# browser, or a module's fixture, stay on one worker (conftest.py groups them), the rest are
# spread. pytest stays below 9.2, which drops the groups (pyproject.toml).
PYTEST := $(PY) -m pytest -q -n $(or $(TEST_WORKERS),2) --dist loadgroup

test:
	$(MAKE) --no-print-directory -j2 --output-sync=target test-setup
	$(PYTEST)

# What the suite needs, the system packages beside the virtualenv: apt-get and pip/uv wait on
# different things, so `make test` runs the two at once (-j2). The system packages install one
# after the other (they share dpkg's lock).
test-setup: system-packages $(VERL_STAMP)

system-packages:
	.ci/ensure-libseccomp
	.ci/ensure-chromium

# `make test` that also appends its durations (install included) to the committed record
# docs/benchmarks/tests.jsonl, read by docs/benchmarks.md's generated table.
test-record:
	t0=$$(date +%s); $(MAKE) --no-print-directory -j2 --output-sync=target test-setup && \
	LABKIT_INSTALL_SECONDS=$$(( $$(date +%s) - t0 )) LABKIT_TEST_RECORD=docs/benchmarks/tests.jsonl \
		$(PYTEST)

# The inner loop: the unit tests of the floors env, policy, credit and loops, without the tests
# marked slow (end-to-end runs, large property checks) or browser. `make test` runs everything.
FAST_TESTS := $(addprefix tests/test_,$(addsuffix .py,bugs tasks sandbox sandbox_adversarial \
	feedback synthetic balanced regime_leaks rollout forking lean plain policy_loading prompts \
	credit_core anchors reshaping fork_credit credit_pipeline trainer episodes verifier config \
	stats layering))

test-fast: libseccomp $(STAMP)
	$(PYTEST) -m "not slow and not browser" $(FAST_TESTS)

# `make test-fast` that also appends its durations to docs/benchmarks/tests.jsonl.
test-fast-record: libseccomp $(STAMP)
	LABKIT_TEST_SUITE=fast LABKIT_TEST_RECORD=docs/benchmarks/tests.jsonl \
		$(PYTEST) -m "not slow and not browser" $(FAST_TESTS)

chromium:
	.ci/ensure-chromium

libseccomp:
	.ci/ensure-libseccomp

# JupyterLab serving the repository, open on notebooks/ (docs/ links open); saving a tracked
# notebook strips its outputs; runs as root too (.jupyter/jupyter_server_config.py).
# JUPYTER_ARGS adds options, e.g. JUPYTER_ARGS="--no-browser --port=8890".
jupyter: $(STAMP)
	$(VENV)/bin/jupyter lab --config=.jupyter/jupyter_server_config.py $(JUPYTER_ARGS)

# An experiment for the record: run from a git worktree at the current commit (refused when the
# code has uncommitted changes), so the code under the runs never changes while they train; its
# runs go to runs/experiments/<commit>/ (the worktree's runs/ is this checkout's, so pages name
# run folders as here; run the same command again to resume; credit keeps no runs) and the
# pages it writes are copied into docs/results. `make record-experiment NAME=didpo ARGS="--set seeds=[0,1,2,3]"`.
record-experiment: libseccomp $(STAMP)
	@test -n "$(NAME)" || { echo "give the experiment: make record-experiment NAME=learning"; exit 2; }
	@test -z "$$(git status --porcelain -- labkit data pyproject.toml constraints.txt)" || \
		{ echo "commit the code first: an experiment for the record runs at one clean commit"; exit 2; }
	c=$$(git rev-parse --short=12 HEAD); wt=runs/worktrees/$$c; \
	[ -d $$wt ] || git worktree add --detach $$wt HEAD; \
	ln -sfn $(CURDIR)/$(VENV) $$wt/$(VENV); ln -sfn $(CURDIR)/runs $$wt/runs; \
	cd $$wt && touch .started && PYTHONPATH=$$PWD $(CURDIR)/$(PY) -m labkit experiment $(NAME) --set out=docs/results \
		$(if $(filter credit,$(NAME)),,--set run_root=runs/experiments/$$c) $(ARGS) && \
	find docs/results -maxdepth 1 -type f -newer .started -exec cp {} $(CURDIR)/docs/results/ \;

bench: libseccomp $(STAMP)
	$(PY) -m labkit.bench sandbox

clean-venv:
	rm -rf $(VENV)
