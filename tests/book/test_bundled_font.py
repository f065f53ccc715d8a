"""The CJK font that ships with attn_lib (attn_lib/data/fonts/): size, license, coverage, and figures on a
machine without any font.

The subset (scripts/make_font_subset.py) must cover every character of the chapters' code cells
and attn_lib's source that its source font has, and the most common Han characters; it stays
under 4 MiB with its OFL license beside it, and ships as package data. The decisive test
hides every system font: in a private mount namespace (``unshare -m``, or ``unshare -rm``
when not root) empty tmpfs folders cover /usr/share/fonts, /usr/local/share/fonts, the
per-user font folders and fontconfig's caches, and matplotlib starts with an empty
MPLCONFIGDIR. Chapters 04 and 08 then run cell by cell (Agg) and every figure is drawn: no
missing-glyph warning, no findfont complaint, and the font chosen is the bundled one.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from attn_lib.figures import fonts  # noqa: E402

HIDDEN_CHAPTERS = ["chapters/04_scaling.ipynb", "chapters/08_flash_attention.ipynb"]

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
    assert 100_000 < size <= 4 * 1024 * 1024, f"{fonts.BUNDLED_FONT_PATH} is {size} bytes"
    license_text = fonts.BUNDLED_LICENSE_PATH.read_text(encoding="utf-8")
    assert "SIL OPEN FONT LICENSE Version 1.1" in license_text and "Adobe" in license_text
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    assert {"fonts/*.otf", "fonts/OFL.txt"} <= set(data["attn_lib.data"]), data


def test_font_names_itself_as_the_subset():
    from fontTools.ttLib import TTFont

    names = TTFont(str(fonts.BUNDLED_FONT_PATH))["name"]
    assert names.getDebugName(1) == fonts.BUNDLED_FAMILY != "Noto Sans CJK SC"
    assert fonts.BUNDLED_FAMILY not in fonts.CJK_FONT_CANDIDATES


def test_font_covers_the_code_cells_and_common_characters():
    from fontTools.ttLib import TTFont
    from make_font_subset import HAN, code_cell_chars, common_han

    have = TTFont(str(fonts.BUNDLED_FONT_PATH)).getBestCmap()
    code_han = sorted(c for c in code_cell_chars() if HAN.match(c))
    assert len(code_han) > 300
    missing = [c for c in code_han if ord(c) not in have]
    assert not missing, f"Han characters of the code cells missing from the bundled font: {''.join(missing)}"
    common = common_han()
    assert len(common) == 3500 and sum(ord(c) in have for c in common) == len(common)
    for c in "，。：；？！（）「」、—…·∞√×→≈≤≥αβ":  # punctuation and symbols the labels use
        assert ord(c) in have, c


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
                "XDG_CACHE_HOME": str(tmp_path / "cache")})
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
