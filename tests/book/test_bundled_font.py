"""The CJK font that ships with attn_lib (attn_lib/data/fonts/): size, license, coverage, and figures on a
machine without any font.

The subset (scripts/make_font_subset.py) must cover the 3,755 characters of GB 2312 level 1 and
every character of the book (chapters' markdown, code and text outputs, intro.md, glossary.md,
attn_lib's source) that its source font has; both sets are computed here, not taken from the
script. It stays under 4 MiB with its OFL license beside it, and ships as package data; the
script's ``--check`` fails on a subset that lacks a character. The decisive test hides every
system font: in a private mount namespace (``unshare -m``, or ``unshare -rm`` when not root)
empty tmpfs folders cover /usr/share/fonts, /usr/local/share/fonts, the per-user font folders
and fontconfig's caches, and matplotlib starts with an empty MPLCONFIGDIR. Chapters 04 and 08
then run cell by cell (Agg) and every figure is drawn: no missing-glyph warning, no findfont
complaint, and the font chosen is the bundled one. Then a figure labelled with RARE (a CJK
Ext-A character outside the subset) is drawn and saved several times: exactly one warning,
attn_lib's, with how to install a full font, and none of matplotlib's per-glyph ones.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from attn_lib.figures import fonts  # noqa: E402

HIDDEN_CHAPTERS = ["chapters/04_scaling.ipynb", "chapters/08_flash_attention.ipynb"]
SOURCE_TTC = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")  # Debian's fonts-noto-cjk
RARE = "\u4dae"  # 䶮, CJK Ext-A (as in the name 刘䶮): not GB 2312, not in the book; checked below

# Runs inside the namespace: every code cell of each chapter, every figure drawn, warnings and
# matplotlib's log collected; prints one JSON line.
_RUNNER = r'''
import json, logging, sys, warnings
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib import font_manager
import nbformat

caught, logged = [], []
warnings.simplefilter("always")
warnings.showwarning = lambda message, category, *a, **k: caught.append(f"{category.__name__}: {message}")


class Keep(logging.Handler):
    def emit(self, record):
        logged.append(record.getMessage())


logging.getLogger("matplotlib").addHandler(Keep(level=logging.WARNING))
report = {"system_fonts": font_manager.findSystemFonts(), "chapters": {}}
for path in sys.argv[1:]:
    ns, figures = {"__name__": "__main__"}, 0
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        exec(compile(cell.source, path, "exec"), ns)
        for num in plt.get_fignums():
            plt.figure(num).canvas.draw()
            figures += 1
        plt.close("all")
    from attn_lib.figures import fonts
    chosen = fonts.setup_chinese_font()
    where = font_manager.findfont(font_manager.FontProperties(family=chosen), fallback_to_default=False)
    report["chapters"][path] = {"figures": figures, "font": ns.get("font"), "chosen": chosen, "file": where}
report["warnings"] = [w for w in caught if "non-interactive" not in w]
del caught[:]
# A label outside the subset: drawn, saved as PNG, PDF and SVG, drawn again; then a second figure
# with the same character.
import io, os
rare = os.environ["RARE_CHAR"]
for title in (f"label {rare}{rare}", f"again {rare}"):
    fig, ax = plt.subplots()
    ax.set_title(title)
    ax.set_xlabel(f"x {rare}")
    for fmt in ("png", "pdf", "svg"):
        fig.savefig(io.BytesIO(), format=fmt)
    fig.canvas.draw()
    plt.close(fig)
report["rare_warnings"] = [w for w in caught if "non-interactive" not in w]
report["log"] = logged
print(json.dumps(report, ensure_ascii=False))
'''

_HIDE = r'''
for d in /usr/share/fonts /usr/local/share/fonts "$HOME/.fonts" "$HOME/.local/share/fonts" \
         /var/cache/fontconfig "$HOME/.cache/fontconfig"; do
  if [ -d "$d" ]; then mount -t tmpfs tmpfs "$d" || exit 97; fi
done
exec "$@"
'''


def test_font_file_size_and_license():
    size = fonts.BUNDLED_FONT_PATH.stat().st_size
    assert 100_000 < size < 4 * 1024 * 1024, f"{fonts.BUNDLED_FONT_PATH} is {size} bytes, expected under 4 MiB"
    license_text = fonts.BUNDLED_LICENSE_PATH.read_text(encoding="utf-8")
    assert "SIL OPEN FONT LICENSE Version 1.1" in license_text and "Adobe" in license_text
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    assert {"fonts/*.otf", "fonts/OFL.txt"} <= set(data["attn_lib.data"]), data


def test_font_names_itself_as_the_subset():
    from fontTools.ttLib import TTFont

    names = TTFont(str(fonts.BUNDLED_FONT_PATH))["name"]
    assert names.getDebugName(1) == fonts.BUNDLED_FAMILY != "Noto Sans CJK SC"
    assert fonts.BUNDLED_FAMILY not in fonts.CJK_FONT_CANDIDATES


def _gb2312_level1() -> set[str]:
    """GB 2312 level 1, found by encoding: every BMP character whose GB 2312 code has a lead byte 0xB0-0xD7."""
    chars = set()
    for u in range(0x4E00, 0xA000):  # GB 2312's Han characters are all in this block
        with contextlib.suppress(UnicodeEncodeError):
            code = chr(u).encode("gb2312")
            if 0xB0 <= code[0] <= 0xD7:
                chars.add(chr(u))
    return chars


def _book_chars() -> set[str]:
    """Every printable character of the book, read from the raw notebook JSON and the text files."""
    texts = []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            texts.append("".join(cell["source"]))
            for out in cell.get("outputs", []):
                texts.append("".join(out.get("text", [])))
                texts += ["".join(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
    for path in [ROOT / "intro.md", ROOT / "glossary.md", *sorted((ROOT / "attn_lib").rglob("*.py"))]:
        texts.append(path.read_text(encoding="utf-8"))
    return {c for t in texts for c in t if unicodedata.category(c)[0] != "C"}


def _cmap(path: Path, family: str | None = None) -> dict[int, str]:
    from fontTools.ttLib import TTCollection, TTFont

    if family is None:
        return TTFont(str(path)).getBestCmap()
    if not path.is_file():
        pytest.fail(f"{path} is missing: install Debian's fonts-noto-cjk (scripts/install-system-deps.sh)")
    return next(f for f in TTCollection(str(path)).fonts if f["name"].getDebugName(1) == family).getBestCmap()


def test_font_covers_gb2312_level1_and_every_book_character():
    have = _cmap(fonts.BUNDLED_FONT_PATH)
    level1 = _gb2312_level1()
    assert len(level1) == 3755, f"GB 2312 level 1 has 3755 characters, the gb2312 codec gave {len(level1)}"
    missing = sorted(c for c in level1 if ord(c) not in have)
    assert not missing, f"{len(missing)} GB 2312 level-1 characters missing from the bundled font: {''.join(missing)}"
    source = _cmap(SOURCE_TTC, "Noto Sans CJK SC")
    book = _book_chars()
    assert sum(0x4E00 <= ord(c) <= 0x9FFF for c in book) > 300  # the reader found the chapters' Chinese
    missing = sorted(c for c in book if ord(c) in source and ord(c) not in have)
    assert not missing, f"book characters missing from the bundled font: {''.join(missing)} (regenerate: make font)"
    for c in "，。：；？！（）「」、—…·∞√×→≈≤≥αβ½é":  # punctuation and symbols the labels use
        assert ord(c) in have, c


def test_the_rare_test_character_is_outside_the_subset():
    """RARE, the label of the hidden-font test, must be one the subset lacks (else that test proves nothing)."""
    assert unicodedata.name(RARE).startswith("CJK UNIFIED IDEOGRAPH-") and 0x3400 <= ord(RARE) <= 0x4DBF
    assert RARE not in _gb2312_level1() and RARE not in _book_chars()
    assert ord(RARE) not in _cmap(fonts.BUNDLED_FONT_PATH)
    assert ord(RARE) in _cmap(SOURCE_TTC, "Noto Sans CJK SC")  # a full CJK font does draw it


def test_check_mode_fails_on_a_subset_that_lacks_a_character(tmp_path, monkeypatch, capsys):
    from fontTools import subset
    from fontTools.ttLib import TTFont

    import make_font_subset

    assert make_font_subset.main(["--check"]) == 0  # the committed subset
    capsys.readouterr()
    font = TTFont(str(fonts.BUNDLED_FONT_PATH))
    subsetter = subset.Subsetter(subset.Options(name_IDs=["*"], notdef_outline=True))
    subsetter.populate(unicodes=[u for u in font.getBestCmap() if u != ord("馏")])
    subsetter.subset(font)
    font.save(str(tmp_path / "lacking.otf"))
    monkeypatch.setattr(make_font_subset, "BUNDLED_FONT_PATH", tmp_path / "lacking.otf")
    assert make_font_subset.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["lacking"] == ["馏"] and "make font" in err, (out, err)


def test_a_system_cjk_font_is_preferred():
    """With Noto CJK installed (this machine), the system font wins over the bundled one."""
    chosen = fonts.setup_chinese_font(force=True)
    assert chosen in fonts.CJK_FONT_CANDIDATES, chosen


def _namespace_command() -> list[str]:
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is missing; it hides the system fonts for this test")
    base = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-r", "-m"]
    for prefix in (base, ["unshare", "-r", "-m"]):
        probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True, timeout=60)
        if probe.returncode == 0:
            return prefix
    pytest.fail("cannot make a private mount namespace (unshare -m / -rm): run as root, or in a container "
                "with --cap-add SYS_ADMIN (.github/workflows/book.yml does)")


def test_chapter_figures_draw_with_every_system_font_hidden(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND",)}
    env.update({"MPLCONFIGDIR": str(tmp_path / "mplconfig"), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                "XDG_CACHE_HOME": str(tmp_path / "cache"), "RARE_CHAR": RARE})
    runner = tmp_path / "runner.py"
    runner.write_text(_RUNNER, encoding="utf-8")
    cmd = [*_namespace_command(), "sh", "-c", _HIDE, "hide-fonts", sys.executable, str(runner), *HIDDEN_CHAPTERS]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["system_fonts"] == [], f"system fonts still visible: {report['system_fonts'][:5]}"
    for path, ch in report["chapters"].items():
        assert ch["figures"] >= 3, f"{path}: only {ch['figures']} figures drawn"
        assert ch["chosen"] == fonts.BUNDLED_FAMILY, f"{path}: chose {ch['chosen']!r}, not the bundled font"
        assert Path(ch["file"]).resolve() == fonts.BUNDLED_FONT_PATH.resolve(), ch["file"]
    assert report["chapters"]["chapters/04_scaling.ipynb"]["font"] == fonts.BUNDLED_FAMILY
    assert not report["warnings"], "warnings while drawing:\n" + "\n".join(report["warnings"][:20])
    complaints = [m for m in report["log"] if "findfont" in m or "missing" in m.lower()]
    assert not complaints, "matplotlib's font log:\n" + "\n".join(complaints[:20])
    rare = report["rare_warnings"]
    assert len(rare) == 1, f"{len(rare)} warnings for a label with {RARE!r}, expected one:\n" + "\n".join(rare)
    assert rare[0].startswith("MissingGlyphsWarning: ") and f"{RARE}（U+{ord(RARE):04X}）" in rare[0], rare[0]
    for remedy in ("sudo apt-get install fonts-noto-cjk", "!apt-get install -y fonts-noto-cjk", "macOS"):
        assert remedy in rare[0], f"the warning does not say {remedy!r}: {rare[0]}"
