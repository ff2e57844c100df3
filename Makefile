# Two entry points for users: `make run` and `make test`. Both set up .venv idempotently.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
EXTRAS  := ray,wandb,trl,lora,dev
SRC     := pyproject.toml constraints.txt

.PHONY: run test setup lint browser clean

setup: $(STAMP)

$(STAMP): $(SRC)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, from the pinned CPU wheel; the constraint keeps any later resolve from floating it.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: browser test will skip"

run: setup
	$(BIN)/adwin train --threshold 0.7

test: setup browser
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) runs bench
