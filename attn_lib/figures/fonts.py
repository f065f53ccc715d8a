"""中文字体（各章共用，第 1–13 章的图）：先找系统里的中文字体，没有就用 attn_lib 自带的那一份。

``find_chinese_font()`` picks the first installed CJK font from ``CJK_FONT_CANDIDATES`` with
matplotlib's public font API; when the machine has none (a bare Linux, a fresh cloud
notebook) it registers the subset of Noto Sans CJK SC that ships in ``attn_lib/data/fonts/``
(``BUNDLED_FONT_PATH``, SIL Open Font License 1.1, license in ``BUNDLED_LICENSE_PATH``;
scripts/make_font_subset.py regenerates it). The subset covers every character of the
chapters' code cells and the most common Han characters, so figures show Chinese with no
apt-get. Only when even that file cannot be read does ``setup_chinese_font()`` warn once
(``NO_FONT_MESSAGE``) with how to install a font.

Global state: ``setup_chinese_font()`` is the one function that changes matplotlib's global
rcParams (attn_lib.figures.plotting re-exports it; every chapter calls it in its import cell).
"""
from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

CJK_FONT_CANDIDATES = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans SC",
    "Source Han Sans SC",
    "Source Han Sans CN",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "SimHei",
    "Microsoft YaHei",
    "PingFang SC",
    "Heiti SC",
    "Arial Unicode MS",
)

# The font that ships with attn_lib (package data): used when no candidate above is installed.
BUNDLED_FAMILY = "Noto Sans CJK SC Subset"
FONT_DIR = Path(__file__).resolve().parent.parent / "data" / "fonts"  # attn_lib/data/fonts
BUNDLED_FONT_PATH = FONT_DIR / "NotoSansCJKsc-Subset.otf"
BUNDLED_LICENSE_PATH = FONT_DIR / "OFL.txt"

NO_FONT_MESSAGE = (
    "没有找到中文字体，attn_lib 自带的字体文件也读不出来，图里的中文会显示成方框。"
    "重新安装 attn_lib，或者安装一个中文字体再重启内核："
    "Debian/Ubuntu 运行 `sudo apt-get install fonts-noto-cjk`；"
    "macOS 与 Windows 自带的 PingFang SC / Microsoft YaHei 会被自动选中。"
    f"（attn_lib 依次查找：{', '.join(CJK_FONT_CANDIDATES)}，最后是自带的 {BUNDLED_FONT_PATH}）"
)

_chosen_font: str | None = None
_font_checked = False


def _installed_font_names() -> set[str]:
    from matplotlib import font_manager

    return {f.name for f in font_manager.fontManager.ttflist}


def _add_new_system_fonts() -> None:
    """Register font files installed after matplotlib cached its font list (public API only)."""
    from matplotlib import font_manager

    known = {f.fname for f in font_manager.fontManager.ttflist}
    for path in font_manager.findSystemFonts():
        if path not in known:
            with contextlib.suppress(Exception):  # a file FreeType cannot read is skipped
                font_manager.fontManager.addfont(path)


def _system_font() -> str | None:
    names = _installed_font_names()
    return next((c for c in CJK_FONT_CANDIDATES if c in names), None)


def register_bundled_font() -> str | None:
    """把 attn_lib 自带的中文字体登记给 matplotlib，返回它的字体名；文件缺失或读不出来时返回 None。"""
    from matplotlib import font_manager

    if not BUNDLED_FONT_PATH.is_file():
        return None
    if BUNDLED_FAMILY not in _installed_font_names():
        try:
            font_manager.fontManager.addfont(str(BUNDLED_FONT_PATH))
        except Exception:  # a damaged file: FreeType's error type varies by version
            return None
    return BUNDLED_FAMILY if BUNDLED_FAMILY in _installed_font_names() else None


def find_chinese_font() -> str | None:
    """返回要用的中文字体名：先找系统里装好的，没有就登记并返回 attn_lib 自带的；都不行返回 None。

    Matplotlib caches its font list; a font installed after the cache was written (on Colab,
    by apt) is found by registering the system's new font files once before falling back to
    the bundled subset.
    """
    found = _system_font()
    if found is None:
        _add_new_system_fonts()
        found = _system_font()
    return found if found is not None else register_bundled_font()


def _font_or_none() -> str | None:
    """The CJK font, looked up once per process (warns once when there is none)."""
    global _chosen_font, _font_checked
    if not _font_checked:
        _font_checked = True
        _chosen_font = find_chinese_font()
        if _chosen_font is None:
            warnings.warn(NO_FONT_MESSAGE, stacklevel=3)
    return _chosen_font


def setup_chinese_font(*, force: bool = False) -> str | None:
    """让这个进程里的 matplotlib 图都用中文字体；返回选中的字体名，找不到时提醒一次并返回 None。

    This is the one function that changes matplotlib's global rcParams (the notebooks call it
    once, in their import cell, so that their own plain-matplotlib figures show Chinese).
    ``force=True`` looks the font up again.
    """
    global _font_checked
    import matplotlib as mpl

    if force:
        _font_checked = False
    font = _font_or_none()
    if font is None:
        return None
    rest = [f for f in mpl.rcParams["font.sans-serif"] if f != font]
    mpl.rcParams["font.sans-serif"] = [font, *rest]
    mpl.rcParams["font.family"] = "sans-serif"
    mpl.rcParams["axes.unicode_minus"] = False
    return font
