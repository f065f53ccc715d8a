// Runs in the single-page build just before it is printed (scripts/make_pdf.py, print media,
// a viewport as wide as the A4 text column, the book's fonts loaded). Turns a web page into
// pages of a printed book:
// - every <details> printed open: the 参考答案 (sphinx-design dropdowns) under their exercises,
//   the hidden code (cells tagged hide-input / hide-output: the exercises' checkers) as
//   ordinary code; the print style sheet hides the bars that open them. The one hidden cell
//   that is left out is each chapter's set-up cell (it starts with setupMarker): it installs
//   attn_lib in a fresh notebook, prints nothing here, and would fill a page in every chapter;

// - code and printed output: each pre is shrunk (down to minFontScale) until its longest line
//   fits the column, so printed tables keep their columns; a line that is still too long
//   wraps with a hanging indent, so its continuation starts right of the line's own
//   indentation (Python's structure stays visible);
// - boxes (code cells, outputs, code blocks, answers, tables) no taller than keepMaxPx are
//   kept on one page (class pdf-keep); a taller box may break across pages, and because no
//   box inside it avoids breaking, its content follows it instead of leaving it empty;
// - an inline formula is not broken across lines unless it is wide; punctuation right after a
//   formula or inline code is kept on the same line;
// - a figure taller than imgMaxPx is scaled down, keeping its shape, so it fits on one page;
// - the last box of each chapter loses its bottom margin and shadow, which would otherwise
//   print a page of their own before the next chapter.
// Returns counts of what it changed.
(opts) => {
  const {keepMaxPx, imgMaxPx, minFontScale, setupMarker} = opts;
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  let setupCells = 0;
  for (const pre of article.querySelectorAll('details.hide .cell_input pre')) {
    const cell = pre.closest('.cell');
    if (pre.textContent.trimStart().startsWith(setupMarker) && !cell.querySelector('.cell_output')) {
      cell.remove();
      setupCells++;
    }
  }
  const details = Array.from(article.querySelectorAll('details'));
  details.forEach(d => { d.open = true; });

  function fit(pre) {
    pre.style.setProperty('white-space', 'pre', 'important');  // the print sheet's pre-wrap is !important
    const cs = getComputedStyle(pre);
    const left = parseFloat(cs.paddingLeft), right = parseFloat(cs.paddingRight);
    // scrollWidth counts the left padding and the text; whether it counts the right padding
    // too varies, so it is left out of the text's width (which errs towards shrinking more).
    const overflows = pre.scrollWidth > pre.clientWidth + 1;
    const need = pre.scrollWidth - left, have = pre.clientWidth - left - right;
    pre.style.removeProperty('white-space');
    if (!overflows) return false;
    pre.style.fontSize = `${parseFloat(cs.fontSize) * Math.max(minFontScale, (have / need) * 0.98)}px`;
    return true;
  }

  function splitLines(pre) {
    const lines = [[]];
    for (const node of Array.from(pre.childNodes)) {
      node.textContent.split('\n').forEach((part, i) => {
        if (i > 0) lines.push([]);
        if (!part) return;
        let piece;
        if (node.nodeType === Node.TEXT_NODE) piece = document.createTextNode(part);
        else { piece = node.cloneNode(false); piece.textContent = part; }
        lines[lines.length - 1].push(piece);
      });
    }
    if (lines.length > 1 && !lines[lines.length - 1].length) lines.pop();  // the final newline
    pre.textContent = '';
    for (const pieces of lines) {
      const line = document.createElement('span');
      line.className = 'pdf-line';
      const text = pieces.map(p => p.textContent).join('');
      const hang = text.length - text.trimStart().length + 2;  // the indentation, then 2 columns
      line.style.paddingLeft = `${hang}ch`;
      line.style.textIndent = `-${hang}ch`;
      pieces.forEach(p => line.appendChild(p));
      pre.appendChild(line);
    }
  }

  // An inline formula stays on one line (the site's style sheet lets it wrap between any two
  // symbols, for phones), unless it is wider than 60 % of its paragraph: all are set unbroken
  // at once, measured in one layout, and the wide ones released.
  const formulas = Array.from(article.querySelectorAll('span.math')).filter(m => !m.closest('pre'));
  formulas.forEach(m => m.classList.add('pdf-nowrap'));
  const wide = formulas.filter(m => {
    const block = m.parentElement.closest('p, li, td, th, dt, dd, div, figcaption') || article;
    return m.getBoundingClientRect().width > 0.6 * block.clientWidth;
  });
  wide.forEach(m => m.classList.remove('pdf-nowrap'));
  const unbroken = formulas.length - wide.length;

  // A formula or an inline code name followed by 「，」「。」「、」...: the punctuation stays on
  // the formula's line (a formula is an atomic box and inline code may break anywhere, so a
  // line could start with the comma). Both go into one span that does not wrap, unless the
  // formula alone nearly fills a line.
  const punct = /^[，。、；：？！）」』】]+/;
  let glued = 0;
  for (const el of article.querySelectorAll('span.math, code.literal, a.reference')) {
    const next = el.nextSibling;
    if (el.closest('pre') || el.parentElement.closest('.pdf-nowrap') || !next || next.nodeType !== Node.TEXT_NODE) continue;
    const m = next.textContent.match(punct);
    if (!m) continue;
    const block = el.parentElement.closest('p, li, td, th, dt, dd, div, figcaption') || article;
    if (el.getBoundingClientRect().width > block.clientWidth - 40) continue;  // it and the mark fit a line
    next.splitText(m[0].length);  // next keeps just the punctuation
    const glue = document.createElement('span');
    glue.className = 'pdf-nowrap';
    el.replaceWith(glue);
    glue.append(el, next);
    glued++;
  }

  const pres = Array.from(article.querySelectorAll('pre'));
  let shrunk = 0;
  pres.forEach(pre => { if (fit(pre)) shrunk++; splitLines(pre); });

  // Lines that still wrap (a pre at the smallest size whose lines are longer still), and
  // among them the rows of printed tables: output whose lines (3 or more) have columns, runs
  // of two or more spaces between words. A wrapped table row breaks its columns.
  let wrapped = 0;
  const tableRowsWrapped = [];
  const columns = /\S {2,}\S/;
  for (const pre of pres) {
    const lines = Array.from(pre.querySelectorAll('.pdf-line'));
    const tabular = !!pre.closest('.cell_output') && lines.filter(l => columns.test(l.textContent)).length >= 3;
    for (const line of lines) {
      if (line.getBoundingClientRect().height <= 1.5 * parseFloat(getComputedStyle(line).lineHeight)) continue;
      wrapped++;
      if (tabular && columns.test(line.textContent)) tableRowsWrapped.push(line.textContent.trim().slice(0, 80));
    }
  }

  let scaled = 0;
  for (const img of article.querySelectorAll('img')) {
    const r = img.getBoundingClientRect();
    if (r.height > imgMaxPx && img.naturalHeight) {
      img.style.setProperty('width', `${imgMaxPx * img.naturalWidth / img.naturalHeight}px`, 'important');
      scaled++;
    }
  }

  // A part (chapter) ends where the next one starts a new page. Its last box's bottom margin
  // and shadow would spill a few pixels over the page and print a page of their own: the
  // chain of last elements of each part gets no bottom margin and no shadow.
  let trimmed = 0;
  for (const part of article.querySelectorAll('section.book-part')) {
    for (let el = part; el; el = el.lastElementChild) {
      el.style.setProperty('margin-bottom', '0', 'important');
      el.style.setProperty('box-shadow', 'none', 'important');
      trimmed++;
    }
  }

  const boxes = article.querySelectorAll(
    '.cell_input, .cell_output > .output, div[class*="highlight-"]:not(.cell_input *):not(.cell_output *),'
    + ' details.sd-dropdown, table, div.math');
  let kept = 0;
  boxes.forEach(b => {
    const keep = b.getBoundingClientRect().height <= keepMaxPx;
    b.classList.toggle('pdf-keep', keep);
    if (keep) kept++;
  });
  // Anything wider than the column makes Chromium shrink every page to fit it.
  const overflowPx = Math.max(0, document.documentElement.scrollWidth - window.innerWidth);
  return {overflowPx, setupCells, trimmed, unbroken, glued, details: details.length, pre: pres.length, shrunk, wrapped, tableRowsWrapped, scaled, boxes: boxes.length, kept};
}
