# Two commands on a fresh clone: `make play` and `make test` (both set everything up).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export GRADIO_ANALYTICS_ENABLED := False
export HF_HUB_OFFLINE := 1

.PHONY: play test test-fast lint browser

# torch first: the CPU build of 2.13.0 lies on this machine's disk; an unpinned torch would
# pull a multi-GB CUDA build
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[dev,games]'
	touch $(STAMP)

play: $(STAMP)
	$(VENV)/bin/worldstream play

# Debian's chromium for the browser tests (Playwright cannot download its own browser here);
# without root or apt the browser tests skip with a reason
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null) || \
		echo "chromium not installed: browser tests will be skipped"

# lint, then type checks of the serving core and the shared runner (mypy's default mode: the
# annotated code is checked, unannotated code is not), then the suite
test: $(STAMP) browser
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy engine/core engine/backends/runner.py
	$(VENV)/bin/pytest

# the quick loop: the same checks, the suite less the tests marked slow or browser
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy engine/core engine/backends/runner.py
	$(VENV)/bin/pytest -m "not slow and not browser"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
