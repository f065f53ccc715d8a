# Two commands do all the set-up on a fresh machine:
#   make book   -> .venv with the pinned tools + attn_lib, system packages, the HTML site in
#                  _build/html and the whole book as one PDF, which the site's download menu links
#   make test   -> the same, then every test
#   make html   -> the site alone (its 「整本书 PDF」 link then answers 404 until make pdf)
#   make pdf    -> the whole book as one PDF, _build/pdf/book.pdf (offline: a single-page build
#                  printed by Debian's headless Chromium), also copied into the site as book.pdf
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SITE   := _build/html/index.html
PDF    := _build/pdf/book.pdf

.PHONY: book html test venv sysdeps notebooks clean serve bench-cpu bench-gpu pdf font

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e . || \
	  $(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

book: html pdf

# --all: Sphinx copies _site/static (book.css, book.js) only when it writes a page, so an
# incremental build after editing only those files would keep the old copies (16 s in all).
html: venv
	$(BIN)/jupyter-book build --all --warningiserror --keep-going .

sysdeps:
	bash scripts/install-system-deps.sh

# The PDF: the same book in one page (_build/singlehtml), printed with page numbers, a table of
# contents and the fonts embedded (scripts/make_pdf.py). Every page's download menu links the
# site's copy, _build/html/book.pdf (copied when the site has been built; make book builds the
# site first).
pdf: venv sysdeps
	$(BIN)/jupyter-book build --all --builder singlehtml --warningiserror --keep-going .
	$(BIN)/python scripts/make_pdf.py _build/singlehtml $(PDF)
	if [ -d _build/html ]; then cp $(PDF) _build/html/book.pdf; fi

# Two workers (pytest-xdist), each test file on one worker (nbval runs a notebook's cells in order
# in one kernel); on 2 cores about half the wall time of one worker, because much of it waits on
# kernels, subprocesses, pip and the browser.
test: venv sysdeps book
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
