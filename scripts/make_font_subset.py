"""Regenerate attn_lib/data/fonts/: a subset of Noto Sans CJK SC (SIL OFL 1.1) that ships with attn_lib.

    .venv/bin/python scripts/make_font_subset.py [--source PATH.ttc] [--check]

The subset covers
- every character in the chapters' code cells and in attn_lib's own source (figure labels,
  titles and legends come from there),
- the COMMON_CHARS most frequent Han characters of jieba's dictionary (jieba is pinned for the
  site's search), weighted by word frequency: what a reader is likely to type in an exercise,
- ASCII, Latin-1, Greek, general punctuation, arrows, math operators, CJK symbols and
  punctuation, full-width forms (every one of these the source font has).

The source is Debian's fonts-noto-cjk (scripts/install-system-deps.sh installs it):
NotoSansCJK-Regular.ttc, its Simplified Chinese face. The subset is renamed BUNDLED_FAMILY
(the OFL asks a modified font not to pass for the original), hinting is dropped, and the
license text (the source's copyright line + the OFL, from Debian's copyright file) is written
beside it as OFL.txt. ``--check`` rebuilds in memory and fails when the committed subset
misses a character it should cover (run after editing a chapter's figure labels).
"""
from __future__ import annotations

import argparse
import collections
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
COMMON_CHARS = 3500
MAX_BYTES = 4 * 1024 * 1024
# Blocks kept whole (where the source font has the character).
BLOCKS = [(0x20, 0x7E), (0xA0, 0xFF), (0x370, 0x3FF), (0x2000, 0x206F), (0x2190, 0x21FF),
          (0x2200, 0x22FF), (0x3000, 0x303F), (0xFF00, 0xFFEF)]
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def code_cell_chars() -> set[str]:
    """Every non-ASCII character in the chapters' code cells and in attn_lib's Python source."""
    import nbformat

    chars: set[str] = set()
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                chars.update(cell.source)
    for path in sorted((ROOT / "attn_lib").rglob("*.py")):
        chars.update(path.read_text(encoding="utf-8"))
    return {c for c in chars if ord(c) > 0x7E and unicodedata.category(c)[0] != "C"}


def common_han(n: int = COMMON_CHARS) -> list[str]:
    """The n most frequent Han characters of jieba's dictionary (each word's frequency counted per character)."""
    import jieba

    counts: collections.Counter[str] = collections.Counter()
    with open(Path(jieba.__file__).parent / "dict.txt", encoding="utf-8") as f:
        for line in f:
            word, freq = line.split(" ")[:2]
            for ch in word:
                if HAN.match(ch):
                    counts[ch] += int(freq)
    return [ch for ch, _ in counts.most_common(n)]


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
    from_code = code_cell_chars()
    wanted = from_code | set(common_han())
    wanted |= {chr(u) for lo, hi in BLOCKS for u in range(lo, hi + 1)}
    covered = sorted(c for c in wanted if ord(c) in cmap)
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
    buf = io.BytesIO()
    font.save(buf)
    report = {"characters": len(covered), "han": sum(bool(HAN.match(c)) for c in covered),
              "bytes": buf.tell(), "code_chars": len(from_code),
              "code_chars_not_in_source": sorted(c for c in from_code if ord(c) not in cmap)}
    return buf.getvalue(), report


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
    parser.add_argument("--check", action="store_true", help="fail when the committed subset misses a character")
    args = parser.parse_args(argv)
    data, report = build(args.source)
    if report["bytes"] > MAX_BYTES:
        raise SystemExit(f"the subset is {report['bytes']} bytes, over the {MAX_BYTES} limit; lower COMMON_CHARS")
    if args.check:
        from fontTools.ttLib import TTFont

        have = TTFont(str(BUNDLED_FONT_PATH)).getBestCmap()
        lacking = sorted(c for c in code_cell_chars() if ord(c) not in have and ord(c) in TTFont(
            io.BytesIO(data)).getBestCmap())
        print(json.dumps({"lacking": lacking}, ensure_ascii=False))
        return 1 if lacking else 0
    BUNDLED_FONT_PATH.parent.mkdir(parents=True, exist_ok=True)
    BUNDLED_FONT_PATH.write_bytes(data)
    BUNDLED_LICENSE_PATH.write_text(license_text(args.source), encoding="utf-8")
    print(json.dumps(report, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
