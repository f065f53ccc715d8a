"""Regenerate attn_lib/data/fonts/: a subset of Noto Sans CJK SC (SIL OFL 1.1) that ships with attn_lib.

    .venv/bin/python scripts/make_font_subset.py [--source PATH.ttc] [--check]

The subset covers (each character where the source font has it)
- the 3,755 Han characters of GB 2312 level 1 (rows 16-55, the common simplified characters;
  ``gb2312_level1()`` decodes them with Python's gb2312 codec): what a reader is likely to
  type in an exercise or a figure label of their own,
- every character of the book (``book_chars()``): the chapters' markdown, code and text
  outputs, intro.md, glossary.md and attn_lib's Python source (figure labels, titles and
  legends come from there), control and format characters aside,
- ASCII, Latin-1, Greek, general punctuation, arrows, math operators, CJK symbols and
  punctuation, full-width forms (``BLOCKS``, kept whole).

(Until this version it also took the 3,500 most frequent Han characters of jieba's
dictionary; that list holds mojibake entries, and GB 2312 level 1 is the standard set it
approximated.) A figure label with a character outside the subset gets one warning from
attn_lib.figures.fonts with how to install a full CJK font.

The source is Debian's fonts-noto-cjk (scripts/install-system-deps.sh installs it):
NotoSansCJK-Regular.ttc, its Simplified Chinese face. The subset is renamed BUNDLED_FAMILY
(the OFL asks a modified font not to pass for the original), hinting is dropped, and the
license text (the source's copyright line + the OFL, from Debian's copyright file) is written
beside it as OFL.txt. It must stay under MAX_BYTES (4 MiB). ``--check`` builds nothing: it
fails when the committed subset misses a character it should cover (one the source font has)
or is over MAX_BYTES (run it after editing the book; ``make font`` regenerates).
"""
from __future__ import annotations

import argparse
import io
import json
import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attn_lib.figures.fonts import BUNDLED_FAMILY, BUNDLED_FONT_PATH, BUNDLED_LICENSE_PATH  # noqa: E402

SOURCE_TTC = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
DEBIAN_COPYRIGHT = Path("/usr/share/doc/fonts-noto-cjk/copyright")
SOURCE_FAMILY = "Noto Sans CJK SC"
MAX_BYTES = 4 * 1024 * 1024
GB2312_LEVEL1_COUNT = 3755
# Blocks kept whole (where the source font has the character).
BLOCKS = [(0x20, 0x7E), (0xA0, 0xFF), (0x370, 0x3FF), (0x2000, 0x206F), (0x2190, 0x21FF),
          (0x2200, 0x22FF), (0x3000, 0x303F), (0xFF00, 0xFFEF)]
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
BOOK_TEXT = ["intro.md", "glossary.md"]  # besides chapters/*.ipynb and attn_lib/**/*.py


def gb2312_level1() -> set[str]:
    """The Han characters of GB 2312 level 1: rows 16-55, i.e. EUC-CN lead bytes 0xB0-0xD7 x 0xA1-0xFE."""
    chars = set()
    for lead in range(0xB0, 0xD8):
        for trail in range(0xA1, 0xFF):
            try:
                chars.add(bytes([lead, trail]).decode("gb2312"))
            except UnicodeDecodeError:  # row 55 ends at 0xD7F9
                pass
    if len(chars) != GB2312_LEVEL1_COUNT:
        raise SystemExit(f"the gb2312 codec gave {len(chars)} level-1 characters, expected {GB2312_LEVEL1_COUNT}")
    return chars


def _notebook_text(path: Path) -> list[str]:
    """A notebook's cell sources (markdown and code) and its text outputs (streams, text/* data)."""
    import nbformat

    texts = []
    for cell in nbformat.read(path, as_version=4).cells:
        texts.append(cell.source)
        for out in cell.get("outputs", []):
            texts.append(out.get("text", ""))
            texts.extend(v for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return texts


def book_chars() -> set[str]:
    """Every character of the book: chapters (markdown, code, text outputs), BOOK_TEXT, attn_lib's Python source."""
    texts = [t for path in sorted((ROOT / "chapters").glob("*.ipynb")) for t in _notebook_text(path)]
    texts += [(ROOT / name).read_text(encoding="utf-8") for name in BOOK_TEXT]
    texts += [path.read_text(encoding="utf-8") for path in sorted((ROOT / "attn_lib").rglob("*.py"))]
    return {c for text in texts for c in text if unicodedata.category(c)[0] != "C"}


def wanted_chars() -> set[str]:
    """What the subset should cover where the source font has it: BLOCKS, GB 2312 level 1, the book's characters."""
    return {chr(u) for lo, hi in BLOCKS for u in range(lo, hi + 1)} | gb2312_level1() | book_chars()


def _source_font(path: Path):
    from fontTools.ttLib import TTCollection

    for font in TTCollection(str(path)).fonts:
        if font["name"].getDebugName(1) == SOURCE_FAMILY:
            return font
    raise SystemExit(f"{path} has no {SOURCE_FAMILY!r} face; install fonts-noto-cjk (scripts/install-system-deps.sh)")


def _rename(font) -> None:
    """Give the subset its own names (name table and CFF), as the OFL asks of a modified font."""
    ps_name = BUNDLED_FAMILY.replace(" ", "") + "-Regular"
    names = {1: BUNDLED_FAMILY, 2: "Regular", 3: f"{ps_name};attn_lib", 4: f"{BUNDLED_FAMILY} Regular",
             6: ps_name, 16: BUNDLED_FAMILY, 17: "Regular"}
    table = font["name"]
    table.names = [r for r in table.names if r.nameID not in names or r.nameID in (2, 17)]
    for name_id, value in names.items():
        table.setName(value, name_id, 3, 1, 0x409)
    if "CFF " in font:
        cff = font["CFF "].cff
        top = cff[cff.fontNames[0]]
        cff.fontNames = [ps_name]
        top.FamilyName, top.FullName = BUNDLED_FAMILY, f"{BUNDLED_FAMILY} Regular"


def build(source: Path) -> tuple[bytes, dict]:
    from fontTools import subset

    font = _source_font(source)
    cmap = font.getBestCmap()
    from_book = book_chars()
    covered = sorted(c for c in wanted_chars() if ord(c) in cmap)
    options = subset.Options()
    options.hinting = False
    options.desubroutinize = False
    options.name_IDs = ["*"]
    options.name_languages = ["*"]
    options.notdef_outline = True
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=[ord(c) for c in covered])
    subsetter.subset(font)
    _rename(font)
    font.recalcTimestamp = False  # keep the source's head.modified: the same input gives the same bytes
    buf = io.BytesIO()
    font.save(buf)
    report = {"characters": len(covered), "han": sum(bool(HAN.match(c)) for c in covered),
              "bytes": buf.tell(), "book_chars": len(from_book),
              "book_chars_not_in_source": sorted(c for c in from_book if ord(c) not in cmap)}
    return buf.getvalue(), report


def check(source: Path, subset_path: Path | None = None) -> dict:
    """What the committed subset (or subset_path) lacks of wanted_chars() where the source font has it, and its size."""
    from fontTools.ttLib import TTFont

    subset_path = BUNDLED_FONT_PATH if subset_path is None else subset_path
    source_cmap = _source_font(source).getBestCmap()
    have = TTFont(str(subset_path)).getBestCmap()
    lacking = sorted(c for c in wanted_chars() if ord(c) in source_cmap and ord(c) not in have)
    return {"lacking": lacking, "bytes": subset_path.stat().st_size, "characters": len(have)}


def license_text(source: Path) -> str:
    """The source font's copyright line and the OFL 1.1 (from Debian's copyright file)."""
    from fontTools.ttLib import TTCollection

    notice = next(f for f in TTCollection(str(source)).fonts if f["name"].getDebugName(1) == SOURCE_FAMILY)
    copyright_line = notice["name"].getDebugName(0)
    text = DEBIAN_COPYRIGHT.read_text(encoding="utf-8")
    block = text.split("License: SIL-1.1\n", 2)[2].split("\nLicense: ", 1)[0]
    ofl = "\n".join("" if ln.strip() == "." else ln[1:] for ln in block.rstrip().splitlines())
    return (f"{BUNDLED_FAMILY}: a subset of {SOURCE_FAMILY} (Noto CJK, Debian package fonts-noto-cjk),\n"
            f"made by scripts/make_font_subset.py. Modified Version under the SIL Open Font License 1.1.\n\n"
            f"{copyright_line}\n\n{ofl}\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE_TTC)
    parser.add_argument("--check", action="store_true",
                        help="fail when the committed subset misses a character or is over MAX_BYTES")
    args = parser.parse_args(argv)
    if args.check:
        found = check(args.source)
        print(json.dumps(found, ensure_ascii=False))
        lacking = found["lacking"]
        if found["bytes"] > MAX_BYTES:
            print(f"{BUNDLED_FONT_PATH} is {found['bytes']} bytes, over the {MAX_BYTES} limit; "
                  "regenerate it (`make font`) with fewer characters", file=sys.stderr)
        if lacking:
            print(f"{BUNDLED_FONT_PATH} lacks {len(lacking)} characters it should cover "
                  f"({''.join(lacking[:40])}{'…' if len(lacking) > 40 else ''}); "
                  "regenerate it with `make font` and commit it", file=sys.stderr)
        return 1 if lacking or found["bytes"] > MAX_BYTES else 0
    data, report = build(args.source)
    if report["bytes"] > MAX_BYTES:
        raise SystemExit(f"the subset is {report['bytes']} bytes, over the {MAX_BYTES} limit; keep fewer characters")
    BUNDLED_FONT_PATH.parent.mkdir(parents=True, exist_ok=True)
    BUNDLED_FONT_PATH.write_bytes(data)
    BUNDLED_LICENSE_PATH.write_text(license_text(args.source), encoding="utf-8")
    print(json.dumps(report, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
