# Two commands do all the set-up on a fresh machine:
#   make book   -> .venv with the pinned tools + attn_lib, then the HTML site in _build/html
#   make test   -> the same set-up, system packages for the browser tests, the site, the PDF, then every test
#   make pdf    -> the whole book as one PDF, _build/pdf/book.pdf (offline: a single-page build
#                  printed by Debian's headless Chromium), also copied into the site as book.pdf
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SITE   := _build/html/index.html
PDF    := _build/pdf/book.pdf

.PHONY: book test venv sysdeps notebooks clean serve bench-cpu bench-gpu pdf font

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

# The PDF: the same book in one page (_build/singlehtml), printed with page numbers, a table of
# contents and the fonts embedded (scripts/make_pdf.py). Every page's download menu links the
# site's copy, _build/html/book.pdf (copied when the site has been built).
pdf: venv sysdeps
	$(BIN)/jupyter-book build --builder singlehtml --warningiserror --keep-going .
	$(BIN)/python scripts/make_pdf.py _build/singlehtml $(PDF)
	if [ -d _build/html ]; then cp $(PDF) _build/html/book.pdf; fi

# Two workers (pytest-xdist), each test file on one worker (nbval runs a notebook's cells in order
# in one kernel); on 2 cores about half the wall time of one worker, because much of it waits on
# kernels, subprocesses, pip and the browser.
test: venv sysdeps book pdf
	$(BIN)/python -m pytest -n 2 --dist loadfile

# Regenerate the CJK font subset that ships in attn_lib/data/fonts/ (after editing figure labels).
font: venv sysdeps
	$(BIN)/python scripts/make_font_subset.py

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
