"""中文字体（各章共用，第 1–13 章的图）：先找系统里的中文字体，没有就用 attn_lib 自带的那一份。

``find_chinese_font()`` picks the first installed CJK font from ``CJK_FONT_CANDIDATES`` with
matplotlib's public font API; when the machine has none (a bare Linux, a fresh cloud
notebook) it registers the subset of Noto Sans CJK SC that ships in ``attn_lib/data/fonts/``
(``BUNDLED_FONT_PATH``, SIL Open Font License 1.1, license in ``BUNDLED_LICENSE_PATH``;
scripts/make_font_subset.py regenerates it). The subset covers the 3,755 Han characters of
GB 2312 level 1 (the common simplified characters), every character of the book (chapters,
intro, glossary, attn_lib's source) that its source font has, and whole blocks of Latin,
Greek, punctuation, arrows, math operators, CJK symbols and full-width forms, so figures
show Chinese with no apt-get. Only when even that file cannot be read does
``setup_chinese_font()`` warn once (``NO_FONT_MESSAGE``) with how to install a font.

Characters outside the subset: matplotlib would warn once per glyph ("Glyph NNNN (...)
missing from font(s) Noto Sans CJK SC Subset."). When the subset is the chosen font,
``setup_chinese_font()`` instead (1) adds one ``warnings`` filter that ignores exactly those
per-glyph messages (the ones naming the subset as the first font; no other warning), and
(2) adds ``watch_missing_glyphs`` to the ``figure.hooks`` rcParam, so that every pyplot
figure checks its text when drawn and warns with ``MissingGlyphsWarning``
(``MISSING_GLYPHS_MESSAGE``: the characters, and how to install a full CJK font). The
warning is given once per character per session: the first figure that shows a missing
character warns once, naming all its missing characters; redrawing or saving it, or later
figures with the same characters, stay quiet; a later figure with a new missing character
warns once more, naming only the new ones (a single warning per session would leave those
as silent boxes; one per figure would repeat itself on every redraw). Limits: a figure made
without pyplot (``Figure()`` directly, rare in a notebook) is not checked, and the filter
hides its per-glyph warnings too; filters a reader adds after the set-up (say
``warnings.simplefilter("always")``) come first and bring the per-glyph warnings back.

Global state: ``setup_chinese_font()`` is the one function that changes matplotlib's global
rcParams (attn_lib.figures.plotting re-exports it; every chapter calls it in its import cell),
and, with the bundled font, the one warnings filter above.
"""
from __future__ import annotations

import contextlib
import functools
import re
import unicodedata
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

INSTALL_HINT = (
    "Debian/Ubuntu 运行 `sudo apt-get install fonts-noto-cjk`；"
    "Colab 与魔搭 ModelScope 在 notebook 的代码格里运行 `!apt-get install -y fonts-noto-cjk`；"
    "macOS 与 Windows 自带的 PingFang SC / Microsoft YaHei 会被自动选中。"
)

NO_FONT_MESSAGE = (
    "没有找到中文字体，attn_lib 自带的字体文件也读不出来，图里的中文会显示成方框。"
    "重新安装 attn_lib，或者安装一个中文字体再重启内核："
    f"{INSTALL_HINT}"
    f"（attn_lib 依次查找：{', '.join(CJK_FONT_CANDIDATES)}，最后是自带的 {BUNDLED_FONT_PATH}）"
)

MISSING_GLYPHS_MESSAGE = (
    "图里有 {count} 个字符不在 attn_lib 自带的中文字体 {family} 里，会显示成方框：{chars}。"
    "这份字体只是子集：GB 2312 一级汉字（3755 个常用字）、书里用到的字符和常用符号。"
    "要显示任意汉字，请安装完整的中文字体，再运行 `setup_chinese_font(force=True)` 或重启内核："
    f"{INSTALL_HINT}"
)

# The hook that setup_chinese_font() adds to the figure.hooks rcParam with the bundled font.
FIGURE_HOOK = f"{__name__}:watch_missing_glyphs"
# matplotlib's per-glyph message (matplotlib/_text_helpers.py, warn_on_missing_glyph) when the
# subset is the first font of the text: "Glyph 13312 (\N{...}) missing from font(s) <family>[, ...]."
_PER_GLYPH = rf"Glyph \d+ \(.*\) missing from font\(s\) {re.escape(BUNDLED_FAMILY)}[.,]"
_DOLLARS = re.compile(r"(?<!\\)\$.*?(?<!\\)\$")


class MissingGlyphsWarning(UserWarning):
    """图里有字符不在 attn_lib 自带的中文字体子集里（会显示成方框）时给的警告。"""


_chosen_font: str | None = None
_font_checked = False
_reported: set[str] = set()  # missing characters already named in a warning this session


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


@functools.lru_cache(maxsize=None)
def _charmap(path) -> frozenset[int]:
    from matplotlib import font_manager

    return frozenset(font_manager.get_font(path).get_charmap())


def _font_files(prop) -> list:
    """The files matplotlib draws text of these properties with: one per family, in fallback order."""
    from matplotlib import font_manager

    files = []
    for family in prop.get_family():
        one = prop.copy()
        one.set_family(family)
        with contextlib.suppress(ValueError):  # a family that is not installed is skipped, as matplotlib does
            files.append(font_manager.findfont(one, fallback_to_default=False))
    return files


def _drawn_chars(text) -> str:
    """The characters of a Text artist that its own font draws (not TeX, not the $...$ parts)."""
    from matplotlib import cbook

    if not text.get_visible() or text.get_usetex():
        return ""
    s = text.get_text()
    return _DOLLARS.sub("", s) if cbook.is_math_text(s) else s


def chars_missing_from_bundled(fig) -> set[str]:
    """返回这张图里用自带字体子集画、却不在子集（及其后备字体）里的字符；子集没被用到时返回空集。"""
    from matplotlib.text import Text

    bundled = BUNDLED_FONT_PATH.resolve()
    missing: set[str] = set()
    for text in fig.findobj(Text):  # titles, axis and tick labels, legends, annotations, table cells
        chars = {c for c in _drawn_chars(text) if unicodedata.category(c)[0] != "C"}
        if not chars:
            continue
        files = _font_files(text.get_fontproperties())
        if not any(Path(f).resolve() == bundled for f in files):
            continue
        maps = [_charmap(f) for f in files]
        missing.update(c for c in chars if not any(ord(c) in m for m in maps))
    return missing


def _warn_new_missing(event) -> None:
    """draw_event callback: one MissingGlyphsWarning for the characters not named before this session."""
    new = chars_missing_from_bundled(event.canvas.figure) - _reported
    if new:
        _reported.update(new)
        chars = "、".join(f"{c}（U+{ord(c):04X}）" for c in sorted(new))
        warnings.warn(MISSING_GLYPHS_MESSAGE.format(count=len(new), family=BUNDLED_FAMILY, chars=chars),
                      MissingGlyphsWarning, stacklevel=1)


def watch_missing_glyphs(fig) -> None:
    """（由 rcParams 的 figure.hooks 调用）这张图每次画出时检查文字，自带字体子集缺字就提醒一次。"""
    fig.canvas.mpl_connect("draw_event", _warn_new_missing)


def setup_chinese_font(*, force: bool = False) -> str | None:
    """让这个进程里的 matplotlib 图都用中文字体；返回选中的字体名，找不到时提醒一次并返回 None。

    This is the one function that changes matplotlib's global rcParams (the notebooks call it
    once, in their import cell, so that their own plain-matplotlib figures show Chinese).
    With the bundled subset chosen it also adds ``FIGURE_HOOK`` to ``figure.hooks`` and one
    warnings filter for matplotlib's per-glyph message about the subset (see the module
    docstring): a character outside the subset gets one ``MissingGlyphsWarning`` with the
    remedy instead of one warning per glyph. ``force=True`` looks the font up again (after
    installing a font) and forgets which missing characters were already named.
    """
    global _font_checked
    import matplotlib as mpl

    if force:
        _font_checked = False
        _reported.clear()
    font = _font_or_none()
    if font is None:
        return None
    rest = [f for f in mpl.rcParams["font.sans-serif"] if f != font]
    mpl.rcParams["font.sans-serif"] = [font, *rest]
    mpl.rcParams["font.family"] = "sans-serif"
    mpl.rcParams["axes.unicode_minus"] = False
    hooks = [h for h in mpl.rcParams["figure.hooks"] if h != FIGURE_HOOK]
    if font == BUNDLED_FAMILY:
        hooks.append(FIGURE_HOOK)
        warnings.filterwarnings("ignore", message=_PER_GLYPH, category=UserWarning)
    mpl.rcParams["figure.hooks"] = hooks
    return font
