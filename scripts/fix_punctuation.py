"""Chinese typography fixer for the book: full-width punctuation and one spacing rule.

Run it from the repository root; it is idempotent (a second run changes nothing):

    .venv/bin/python scripts/fix_punctuation.py            # fix every file in place
    .venv/bin/python scripts/fix_punctuation.py --check    # list what it would change, exit 1 if any
    .venv/bin/python scripts/fix_punctuation.py FILE ...   # only these files

What it does, in Chinese prose only:
- a half-width , : ; ? ! ( ) next to a Chinese character becomes ``，：；？！（）``
  (parentheses are converted in pairs, so a pair is never left half open);
- in a line with Chinese, a half-width , : ; between a digit, a Latin word, code or math and
  the next one with no space (``709.78,float32``, ``< 1e-12:True``, ``（Adam,float64）``),
  or at the end of the line (``加起来等于 1:``), becomes ``，：；``; left alone: digit groups
  and ratios (``262,144``, ``16:9``), tuples written without spaces (``(B,H,L,D)``),
  ``arXiv:2205.14135`` and ``localhost:8000``;
- one spacing rule: a half-width space between a Chinese character and an adjacent
  Latin letter or digit (``长度 L 为 4096 时``), no space next to full-width punctuation.

Where it works:
- Markdown files (intro.md, glossary.md, README.md, chapters/*.md) and markdown cells of
  chapters/*.ipynb: everything outside code spans, code blocks, math ($...$, $$...$$),
  URLs and link targets, HTML tags, and MyST syntax (roles such as {term}`...`, directive
  fences such as :::{dropdown} and their :option: lines).
- Python: Chinese string literals and Chinese comments (those containing a Chinese character) in
  notebook code cells and in *.py files under attn_lib/ and scripts/; f-string fields {...},
  backslash escapes and `code` in comments are left alone.

Printed outputs change when printed strings change: re-execute the notebooks it touches.
"""
from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
CJK_PUNCT = "\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65\u2014\u2026\u201c\u201d"
CJK = HAN + CJK_PUNCT
HALF_TO_FULL = {",": "，", ":": "：", ";": "；", "?": "？", "!": "！", "(": "（", ")": "）"}
FULL_NO_SPACE = "，：；？！（）「」、。【】『』《》"

_HAN_RE = re.compile(f"[{HAN}]")
_CJK_RE = re.compile(f"[{CJK}]")

# Placeholders for protected spans: private-use characters (one per span).
_PH0 = 0xE000
_PH_RE = re.compile("[\ue000-\uf8ff]")


def has_han(text: str) -> bool:
    """文本里有没有汉字。"""
    return bool(_HAN_RE.search(text))


def _is_han(ch: str) -> bool:
    return bool(ch) and bool(_HAN_RE.match(ch))


def _is_cjk(ch: str) -> bool:
    return bool(ch) and bool(_CJK_RE.match(ch))


# --------------------------------------------------------------------------- masking

_MD_INLINE_PROTECT = re.compile(
    r"(?:\{[\w:-]+\})?(`+)[\s\S]*?\1"        # code span, with an optional MyST role prefix
    r"|\$\$[\s\S]*?\$\$"                     # display math
    r"|(?<![\\$])\$(?!\s)[^$\n]+?(?<![\s\\])\$(?!\d)"  # inline math
    r"|\]\([^)\s]*\)"                        # link target ](...)
    r"|\]\[[^\]]*\]"                          # reference link ][...]
    r"|<[A-Za-z/!][^>\n]*>"                  # HTML tag or autolink
    r"|https?://[^\s)>\]，。]+"              # bare URL
    r"|\{[\w:-]+\}(?=`)"                     # stray role prefix
    r"|\[\^[^\]]+\]"                         # footnote reference
)


def _mask(text: str, pattern: re.Pattern, spans: list[str]) -> str:
    def repl(m: re.Match) -> str:
        spans.append(m.group(0))
        return chr(_PH0 + len(spans) - 1)
    return pattern.sub(repl, text)


def _unmask(text: str, spans: list[str]) -> str:
    # Spans may nest (a masked span inside a later one): unmask until stable.
    for _ in range(4):
        new = _PH_RE.sub(lambda m: spans[ord(m.group(0)) - _PH0], text)
        if new == text:
            break
        text = new
    return text


# --------------------------------------------------------------------------- the text rules

# A half-width , ; : after a digit, a Latin letter, code/math (a placeholder) or a bracket, and
# before the next such token with no space, or before the end of the line.
_LATIN_PUNCT = re.compile(
    r"(?<=[A-Za-z0-9\ue000-\uf8ff)\]%*])([,;:])(?=([A-Za-z0-9\ue000-\uf8ff(\[<（])|[ \t]*$)")
# Tuples and lists written without spaces, e.g. (B,H,L,D), (1,1,3,4), [0,1]: notation, kept.
_NOTATION_GROUP = re.compile(r"\([^()\s\u3400-\u9fff]*\)|\[[^\[\]\s\u3400-\u9fff]*\]")


def _fix_latin_punct_line(line: str) -> str:
    if not has_han(line):
        return line
    kept = [(m.start(), m.end()) for m in _NOTATION_GROUP.finditer(line)]
    chars = list(line)
    for m in _LATIN_PUNCT.finditer(line):
        i = m.start()
        if any(a < i < b for a, b in kept):
            continue
        prev, rest = line[i - 1], line[i + 1:]
        if prev.isdigit() and rest[:1].isdigit():
            continue  # 262,144 or 16:9: a number, not a sentence separator
        if m.group(1) == ":" and re.search(r"\b(?:arXiv|doi|https?)$", line[:i], re.IGNORECASE):
            continue  # arXiv:2205.14135: an identifier
        if m.group(1) == ":" and rest[:1].isdigit() and re.search(r"(?:localhost|\d+\.\d+\.\d+\.\d+)$", line[:i]):
            continue  # localhost:8000, 127.0.0.1:8000: a host and its port
        chars[i] = HALF_TO_FULL[m.group(1)]
    return "".join(chars)


def fix_latin_punct(text: str) -> str:
    """中文行里夹在数字、拉丁词、代码或公式之间（或在行尾）的半角逗号、分号、冒号改成全角。"""
    return "\n".join(_fix_latin_punct_line(line) for line in text.split("\n"))


_LIST_MARKER = re.compile(r"^\s*(?:[-*+]|\d+[.)]|#{1,6}|>+)?\s*$")


def _convert_parens(chars: list[str], placeholders_count: bool = False) -> None:
    """Convert matching ( ) pairs in place when the pair belongs to Chinese prose."""
    stack: list[int] = []
    pairs: list[tuple[int, int]] = []
    for i, ch in enumerate(chars):
        if ch == "(":
            stack.append(i)
        elif ch == ")":
            if stack:
                pairs.append((stack.pop(), i))
            elif (i > 0 and _is_han(chars[i - 1])) or (i + 1 < len(chars) and _is_han(chars[i + 1])):
                chars[i] = "）"
    for i in stack:  # unmatched "("
        if (i > 0 and _is_han(chars[i - 1])) or (i + 1 < len(chars) and _is_han(chars[i + 1])):
            chars[i] = "（"
    for o, c in pairs:
        before = chars[o - 1] if o > 0 else ""
        after = chars[c + 1] if c + 1 < len(chars) else ""
        inner = "".join(chars[o + 1:c])
        call_like = bool(before) and before.isascii() and (before.isalnum() or before in "_]'\"")
        if call_like and not has_han(inner) and not _PH_RE.search(inner):
            if _is_han(after):
                chars[c] = ") "  # f(x) 的: notation stays, one space before the Chinese
            continue  # f(x), softmax(x): notation, not prose
        next_to_markup = placeholders_count and bool(_PH_RE.match(before) or _PH_RE.match(after))
        if _is_han(before) or _is_han(after) or has_han(inner) or next_to_markup:
            chars[o], chars[c] = "（", "）"


def fix_text(text: str, markdown: bool = False) -> str:
    """把一段已经去掉了代码、公式等受保护部分的中文文本改成全角标点和统一空格。"""
    if not has_han(text):
        return text

    chars = list(text)
    _convert_parens(chars, placeholders_count=markdown)
    text = "".join(chars)

    # , : ; ? ! touching a CJK character (possibly across spaces, which then go).
    def punct(m: re.Match) -> str:
        return HALF_TO_FULL[m.group(2)]
    text = re.sub(rf"(?<=[{CJK}])([ \t]*)([,:;?!])", punct, text)
    text = re.sub(rf"(?<![\d\s])()([,:;?!])[ \t]*(?=[{CJK}])", punct, text)
    text = re.sub(rf"(?<=\d)()([,:;?!])[ \t]*(?=[{CJK}])", punct, text)
    text = fix_latin_punct(text)
    if markdown:  # after code, math or a bracket, before the end of the line or more markup
        text = re.sub(r"(?<=[\ue000-\uf8ff)）*])()([,:;?!])(?=\n|$|[\ue000-\uf8ff*])", punct, text)
        text = re.sub(r"(?<=[\ue000-\uf8ff)])()([,:;])(?=[A-Za-z])", punct, text)
        text = re.sub(r"(?<=[A-Za-z0-9])()([?])(?=\n|$)", punct, text)

    # No space next to full-width punctuation (never touching indentation or list markers).
    def drop_before(m: re.Match) -> str:
        start = m.start()
        line_start = text.rfind("\n", 0, start) + 1
        if _LIST_MARKER.match(text[line_start:start]):
            return m.group(0)
        return m.group(2)
    text = re.sub(rf"(?<=\S)([ \t]+)([{FULL_NO_SPACE}])", drop_before, text)
    text = re.sub(rf"([{FULL_NO_SPACE}])[ \t]+(?=[^\s|])", r"\1", text)

    # One space between a Chinese character and an adjacent Latin letter or digit.
    text = re.sub(rf"([{HAN}])([A-Za-z0-9])", r"\1 \2", text)
    text = re.sub(rf"([A-Za-z0-9])([{HAN}])", r"\1 \2", text)
    return text


# --------------------------------------------------------------------------- markdown

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,}|:{3,})\s*(\{[\w:-]+\})?(.*)$")
_PROSE_DIRECTIVES = {
    "note", "tip", "hint", "warning", "important", "caution", "attention", "danger", "error",
    "seealso", "admonition", "dropdown", "glossary", "margin", "sidebar", "topic", "epigraph",
    "card", "tab-item", "tab-set", "grid-item-card", "div", "figure", "table", "list-table",
}
_OPTION_LINE = re.compile(r"^\s*:[\w-]+:")


def _markdown_segments(text: str):
    """Yield (is_prose, chunk) pieces of a markdown text; chunks concatenate back to it."""
    lines = text.splitlines(keepends=True)
    stack: list[tuple[str, bool]] = []  # open fences: (marker, content_is_prose)
    buf: list[str] = []
    prose = True
    after_directive = False

    def flush():
        if buf:
            yield_list.append((prose, "".join(buf)))
            buf.clear()

    yield_list: list[tuple[bool, str]] = []
    for line in lines:
        m = _FENCE.match(line.rstrip("\n"))
        in_code = bool(stack) and not stack[-1][1]
        if m and in_code:
            marker = m.group(2)
            if marker[0] == stack[-1][0][0] and len(marker) >= len(stack[-1][0]) \
                    and not m.group(3) and not m.group(4).strip():
                flush()
                stack.pop()
                yield_list.append((False, line))
                prose = not stack or stack[-1][1]
                after_directive = False
                continue
        if m and not in_code:
            marker, role, info = m.group(2), m.group(3), m.group(4).strip()
            closing = bool(stack) and marker[0] == stack[-1][0][0] \
                and len(marker) >= len(stack[-1][0]) and not role and not info
            flush()
            yield_list.append((False, line))
            if closing:
                stack.pop()
                after_directive = False
            else:
                name = role[1:-1] if role else ""
                is_prose = marker[0] == ":" or name in _PROSE_DIRECTIVES
                stack.append((marker, is_prose))
                after_directive = True
            prose = not stack or stack[-1][1]
            continue
        if after_directive and _OPTION_LINE.match(line):
            flush()
            yield_list.append((False, line))
            continue
        after_directive = False
        if prose and line.startswith(("    ", "\t")) and not stack and not line.strip() == "":
            pass  # indented text in plain markdown (glossary bodies, nested lists): still prose
        buf.append(line)
    flush()
    return yield_list


def fix_markdown(text: str) -> str:
    """修一段 Markdown：只改正文，代码、公式、网址和 MyST 语法原样保留。"""
    out = []
    for is_prose, chunk in _markdown_segments(text):
        if not is_prose or not has_han(chunk):
            out.append(chunk)
            continue
        spans: list[str] = []
        masked = _mask(chunk, _MD_INLINE_PROTECT, spans)
        fixed = fix_text(masked, markdown=True)
        for _ in range(3):  # to a fixed point, so that a second run changes nothing
            again = fix_text(fixed, markdown=True)
            if again == fixed:
                break
            fixed = again
        out.append(_unmask(fixed, spans))
    return "".join(out)


def prose_of_markdown(text: str) -> str:
    """Markdown 里受检查的正文：代码、公式、网址和 MyST 语法换成占位符。"""
    out = []
    for is_prose, chunk in _markdown_segments(text):
        if is_prose:
            out.append(_mask(chunk, _MD_INLINE_PROTECT, []))
        else:
            out.append("\n" * chunk.count("\n"))
    return "".join(out)


# --------------------------------------------------------------------------- python

_STR_PREFIX = re.compile(r"^([rRbBuUfF]*)('''|\"\"\"|'|\")")
_PY_PROTECT_F = re.compile(r"(`+)[^`]*?\1|\{\{|\}\}|\{[^{}]*\}|\\.")
_PY_PROTECT = re.compile(r"(`+)[^`]*?\1|\\.|%[-+ #0]*\d*(?:\.\d+)?[sdfrigex%]")


def _python_tokens(source: str, kind: int):
    """Yield (start, end, text) offsets of each token of type ``kind`` in Python source (none if it does not tokenize)."""
    line_offsets = [0]
    for line in source.splitlines(keepends=True):
        line_offsets.append(line_offsets[-1] + len(line))
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return
    for tok in tokens:
        if tok.type == kind:
            yield (line_offsets[tok.start[0] - 1] + tok.start[1], line_offsets[tok.end[0] - 1] + tok.end[1],
                   tok.string)


def python_string_literals(source: str):
    """Yield (start, end, prefix, quote) offsets of each string literal in Python source."""
    for start, end, text in _python_tokens(source, tokenize.STRING):
        m = _STR_PREFIX.match(text)
        if m:
            yield start, end, m.group(1), m.group(2)


def python_comments(source: str):
    """Yield (start, end) offsets of the text of each comment (after its ``#`` and spaces) in Python source."""
    for start, end, text in _python_tokens(source, tokenize.COMMENT):
        lead = len(text) - len(text.lstrip("#").lstrip())
        yield start + lead, end


_PY_PROTECT_COMMENT = re.compile(r"(`+)[^`]*?\1")


def _mask_ipython(source: str) -> tuple[str, list[str]]:
    """Blank out IPython-only lines (%magic, !shell) so tokenize accepts the cell."""
    lines = source.splitlines(keepends=True)
    kept = []
    for line in lines:
        if re.match(r"^\s*[%!]", line):
            kept.append("#" + line[1:] if line[:1] in "%!" else line.replace("%", "#", 1).replace("!", "#", 1))
        else:
            kept.append(line)
    return "".join(kept), lines


_ENGLISH_RUN = re.compile(r"[A-Za-z][A-Za-z'-]*(?: [A-Za-z0-9][A-Za-z0-9'-]*){3}")


def is_english_line(line: str) -> bool:
    """English prose that quotes a Chinese word (a docstring line or comment): left alone."""
    han = len(_HAN_RE.findall(line))
    letters = len(re.findall(r"[A-Za-z]", line))
    return bool(_ENGLISH_RUN.search(line)) and han < letters / 2


def _fix_python_text(text: str) -> str:
    lines = text.split("\n")
    return "\n".join(line if is_english_line(line) else fix_text(line) for line in lines)


def _chinese_parts(source: str):
    """Yield (start, end, protect) for the body of each Chinese string literal and the text of each
    Chinese comment, in source order; ``protect`` is what the fixer must leave alone inside it."""
    scan, _ = _mask_ipython(source)
    if len(scan) != len(source):
        scan = source
    parts = []
    for start, end, prefix, quote in python_string_literals(scan):
        body_start, body_end = start + len(prefix) + len(quote), end - len(quote)
        protect = _PY_PROTECT_F if "f" in prefix.lower() else _PY_PROTECT
        parts.append((body_start, body_end, protect))
    parts += [(start, end, _PY_PROTECT_COMMENT) for start, end in python_comments(scan)]
    for start, end, protect in sorted(parts):
        if has_han(source[start:end]):
            yield start, end, protect


def fix_python(source: str) -> str:
    """修 Python 源码里含汉字的字符串字面量和注释。"""
    pieces, last = [], 0
    for start, end, protect in _chinese_parts(source):
        spans: list[str] = []
        fixed = _unmask(_fix_python_text(_mask(source[start:end], protect, spans)), spans)
        pieces += [source[last:start], fixed]
        last = end
    pieces.append(source[last:])
    return "".join(pieces)


def chinese_python_literals(source: str) -> list[str]:
    """源码里含汉字的字符串字面量的正文和注释（f-string 的 {...}、转义和代码片段换成占位符）。"""
    found = []
    for start, end, protect in _chinese_parts(source):
        masked = _mask(source[start:end], protect, [])
        found.append("\n".join(line for line in masked.split("\n") if not is_english_line(line)))
    return found


# --------------------------------------------------------------------------- files

def default_files(root: Path = ROOT) -> list[Path]:
    files = [root / n for n in ("intro.md", "glossary.md", "README.md") if (root / n).exists()]
    files += sorted((root / "chapters").glob("*.md"))
    files += sorted((root / "chapters").glob("*.ipynb"))
    files += sorted((root / "attn_lib").rglob("*.py"))
    files += sorted((root / "scripts").glob("*.py"))
    return files


def _join(src) -> str:
    return "".join(src) if isinstance(src, list) else src


def _split(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def fix_notebook(raw: str, name: str = "") -> str:
    """修一个 notebook 的 markdown 格和代码格里的中文字符串；返回新的 JSON 文本。"""
    nb = json.loads(raw)
    changed = False
    for cell in nb.get("cells", []):
        src = _join(cell.get("source", ""))
        image = cell.get("metadata", {}).get("mystnb", {}).get("image", {})
        if isinstance(image.get("alt"), str):  # a figure's alt text (Chinese, read by screen readers)
            alt = fix_text(image["alt"])
            if alt != image["alt"]:
                image["alt"] = alt
                changed = True
        if cell.get("cell_type") == "markdown":
            new = fix_markdown(src)
        elif cell.get("cell_type") == "code":
            new = fix_python(src)
        else:
            continue
        if new != src:
            cell["source"] = _split(new)
            changed = True
    if not changed:
        return raw
    return json.dumps(nb, ensure_ascii=False, indent=1, sort_keys=True) + "\n"


def fix_file(path: Path) -> bool:
    """修一个文件；改了返回 True。"""
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        new = fix_markdown(raw)
    elif path.suffix == ".ipynb":
        new = fix_notebook(raw, path.name)
    elif path.suffix == ".py":
        new = fix_python(raw)
    else:
        return False
    if new == raw:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, help="files to fix (default: the whole book)")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    ap.add_argument("--exclude", action="append", default=[], help="a path to leave alone (repeatable)")
    args = ap.parse_args(argv)
    files = args.files or default_files()
    excluded = {(ROOT / e).resolve() for e in args.exclude}
    todo = [f for f in files if f.resolve() not in excluded]
    changed = []
    for f in todo:
        raw = f.read_text(encoding="utf-8")
        if args.check:
            new = fix_notebook(raw, f.name) if f.suffix == ".ipynb" else \
                {".md": fix_markdown, ".py": fix_python}.get(f.suffix, lambda s: s)(raw)
            if new != raw:
                changed.append(f)
        elif fix_file(f):
            changed.append(f)
    for f in changed:
        print(("would change " if args.check else "fixed ") + str(f.relative_to(ROOT) if f.is_absolute() and ROOT in f.parents else f))
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
