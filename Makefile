# Two commands do all the set-up on a fresh machine:
#   make book   -> .venv with the pinned tools + attn_lib, then the HTML site in _build/html
#   make test   -> the same set-up, system packages for the browser tests, the site, then every test
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SITE   := _build/html/index.html

.PHONY: book test venv sysdeps notebooks clean serve bench-cpu bench-gpu

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e . || \
	  $(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

book: venv
	$(BIN)/jupyter-book build --warningiserror --keep-going .

sysdeps:
	bash scripts/install-system-deps.sh

test: venv sysdeps book
	$(BIN)/python -m pytest

# Re-execute every notebook in place (commit the outputs afterwards).
notebooks: venv
	$(BIN)/python scripts/run_notebooks.py chapters/*.ipynb

serve:
	$(BIN)/python -m http.server --directory _build/html 8000

bench-cpu: venv
	$(BIN)/python bench/cpu.py

bench-gpu: venv
	$(BIN)/python bench/gpu.py

clean:
	rm -rf _build
