# The README's two commands. Each creates .venv when missing and installs shoal from this
# project's own files, so a fresh machine needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
PEERS_STAMP := $(VENV)/.peers-stamp
DOCS_STAMP := $(VENV)/.docs-stamp

.PHONY: install demo check test lint bench bench-seeds system-packages docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The demo needs shoal alone; the tests add their extras (.[test]) on top of the same install.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(DEMO_STAMP)

# --no-compile: pip compiles every installed module one at a time (some 45 s of torch and the test extras); the
# suite instead compiles what its processes import, once, as they import it (PYTHONDONTWRITEBYTECODE unset below:
# `make check` and `make test`). `make demo` alone installs with pip's compilation, as a user's install does.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-compile -e '.[test,docs]'
	touch $(STAMP) $(DEMO_STAMP) $(DOCS_STAMP)

# The documentation site (mkdocs.yml, docs/): --strict makes a broken link or anchor, or a page missing from
# the nav, an error. docs/hooks.py writes docs/reference/ from the code first.
$(DOCS_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir .site

install: $(STAMP)

# Spark for the peer comparison in benchmarks/peers.py (bench only).
$(PEERS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,peers]'
	touch $(PEERS_STAMP)

demo: $(DEMO_STAMP)
	@test -d .demo/train || $(BIN)/shoal data synth binary --rows 200000 --seed 1 --out .demo/train
	@test -d .demo/test || $(BIN)/shoal data synth binary --rows 20000 --seed 2 --out .demo/test
	@rm -rf .demo/run
	$(BIN)/shoal train examples/demo.toml --workers 2 --run-dir .demo/run

# Launchers the tests start for real (Open MPI's mpirun, MPICH's mpiexec, SLURM and munge): installed from the system's
# packages when running as root and absent; without them those tests skip and say why.
SYSTEM_PACKAGES := openmpi-bin:mpirun.openmpi mpich:mpiexec.mpich slurmctld:slurmctld slurmd:slurmd slurm-client:srun munge:munged
system-packages:
	@missing=""; for entry in $(SYSTEM_PACKAGES); do \
	  command -v $${entry#*:} >/dev/null 2>&1 || missing="$$missing $${entry%%:*}"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null \
	    || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	        $$missing >/dev/null) || echo "could not install$$missing: the tests that need them skip"; fi

# A quick check while editing (under 2 minutes on 2 cores): ruff, and the unit tests, which start no processes
# (tests/conftest.py fails one that does: it belongs in tests/processes, tests/distributed or tests/e2e).
# The unit tests run on two processes (pytest-xdist): they start none of their own, and much of their time is
# waiting (stores, timeouts), not computing.
check: install
	$(BIN)/ruff check src tests benchmarks
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n 2 tests/unit --durations=30

# Bytecode written once: where PYTHONDONTWRITEBYTECODE is set (as in many containers) every process a test starts
# would otherwise compile the modules it imports again (torch's alone take seconds of a core), so it is unset here.
# The suite runs as three pytest-xdist workers, each taking whole files (a module's cluster or trained run is built
# once): no test asserts on elapsed time or speed, and the tests that start processes spend much of their time
# waiting (on start-up, on the network, on a deliberate timeout), so three keep the 2 cores busy.
test: install system-packages
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m compileall -q -j 0 src tests benchmarks
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir .site
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 3 --dist loadfile tests

bench: $(PEERS_STAMP)
	$(BIN)/python -m benchmarks.overhead
	$(BIN)/python -m benchmarks.startup
	$(BIN)/python -m benchmarks.epoch
	$(BIN)/python -m benchmarks.loader
	$(BIN)/python -m benchmarks.budget
	$(BIN)/python -m benchmarks.import_csv
	$(BIN)/python -m benchmarks.algorithms
	$(BIN)/python -m benchmarks.batch
	$(BIN)/python -m benchmarks.server
	$(BIN)/python -m benchmarks.comm
	$(BIN)/python -m benchmarks.step_cost
	$(BIN)/python -m benchmarks.outer
	$(BIN)/python -m benchmarks.stragglers
	$(BIN)/python -m benchmarks.own_code
	$(BIN)/python -m benchmarks.plan_papers
	$(BIN)/python -m benchmarks.plan_replay
	$(BIN)/python -m benchmarks.repeatability
	$(BIN)/python -m benchmarks.peers
	$(BIN)/python -m benchmarks.scaling
	$(MAKE) bench-seeds

# The seeds' experiments at their scale on the dilated emulated cluster (root, about 4 hours on 2 cores).
bench-seeds: $(STAMP)
	$(BIN)/python -m benchmarks.dilation --rows 200000
	$(BIN)/python -m benchmarks.seeds_kennedy
	$(BIN)/python -m benchmarks.seeds_cneural
	$(BIN)/python -m benchmarks.seeds_plan
	$(BIN)/python -m benchmarks.seeds_mpi_learn
	$(BIN)/python -m benchmarks.seeds_mpi_learn_batch
	$(BIN)/python -m benchmarks.control_plane
