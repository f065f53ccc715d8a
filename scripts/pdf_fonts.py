"""整本书 PDF 用的字体：把 Noto CJK 里书中用到的字取出来，转成 TrueType 轮廓，让 PDF 嵌入真正的字体。

Chromium prints through Skia, which embeds a TrueType font (glyf outlines) as a CID TrueType
font but a CFF-flavoured OpenType font — Noto Sans CJK, the CJK font Debian ships — as Type 3
fonts: hundreds of unnamed glyph procedures, which print but which no PDF tool can name,
search by font, or substitute. For the PDF, scripts/make_pdf.py therefore asks this module
for web fonts: the characters the book uses (``chars``), cut from the four Noto faces the
site uses (``FACES``: Sans and Sans Mono, regular and bold) and converted from cubic CFF
curves to quadratic TrueType ones (fontTools' cu2qu, within ``MAX_ERR`` font units, 1/1000
of the em), written beside the single-page build and declared with the same family names in
@font-face rules, which take precedence over the installed fonts of those names.

MathJax's own fonts (vendored, CFF in WOFF) would print as Type 3 too: ``mathjax_faces``
converts each one the page declares and declares the copy under the same family name.

Used only by scripts/make_pdf.py (``make pdf``); the SIL OFL 1.1 of Noto CJK allows modified
copies; these subsets live in the build folder, never in the repository.
"""
from __future__ import annotations

from pathlib import Path

NOTO_DIR = Path("/usr/share/fonts/opentype/noto")
# (CSS family, CSS weight, collection file, the face's family name inside it)
FACES = [
    ("Noto Sans CJK SC", 400, "NotoSansCJK-Regular.ttc", "Noto Sans CJK SC"),
    ("Noto Sans CJK SC", 700, "NotoSansCJK-Bold.ttc", "Noto Sans CJK SC"),
    ("Noto Sans Mono CJK SC", 400, "NotoSansCJK-Regular.ttc", "Noto Sans Mono CJK SC"),
    ("Noto Sans Mono CJK SC", 700, "NotoSansCJK-Bold.ttc", "Noto Sans Mono CJK SC"),
]
MAX_ERR = 1.0  # font units: the largest distance between a cubic curve and its quadratic copy


def _face(collection: Path, family: str):
    from fontTools.ttLib import TTCollection

    for font in TTCollection(str(collection)).fonts:
        if font["name"].getDebugName(1) == family:
            return font
    raise SystemExit(f"{collection} has no face named {family!r}: is fonts-noto-cjk installed "
                     "(bash scripts/install-system-deps.sh)?")


def _subset(font, chars: set[str]) -> None:
    from fontTools import subset

    options = subset.Options()
    options.hinting = False
    options.layout_features = ["*"]
    options.name_IDs = ["*"]
    options.notdef_outline = True
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=sorted(ord(c) for c in chars))
    subsetter.subset(font)


def cff_to_truetype(font) -> None:
    """把一个 CFF 轮廓的 OpenType 字体就地改成 TrueType（glyf）轮廓。"""
    from fontTools.pens.cu2quPen import Cu2QuPen
    from fontTools.pens.ttGlyphPen import TTGlyphPen
    from fontTools.ttLib import newTable

    order = font.getGlyphOrder()
    glyph_set = font.getGlyphSet()
    glyphs = {}
    for name in order:
        pen = TTGlyphPen(glyph_set)
        # CFF contours run counter-clockwise, TrueType's clockwise: reverse them.
        glyph_set[name].draw(Cu2QuPen(pen, MAX_ERR, reverse_direction=True))
        glyphs[name] = pen.glyph()
    font["loca"] = newTable("loca")
    font["glyf"] = glyf = newTable("glyf")
    glyf.glyphOrder = order
    glyf.glyphs = glyphs
    for table in ("CFF ", "VORG"):
        if table in font:
            del font[table]
    glyf.compile(font)
    for name, glyph in glyf.glyphs.items():  # left side bearing = xMin, as TrueType expects
        width, _ = font["hmtx"][name]
        font["hmtx"][name] = (width, getattr(glyph, "xMin", 0))
    maxp = newTable("maxp")
    maxp.tableVersion = 0x00010000
    for field in ("maxZones", "maxTwilightPoints", "maxStorage", "maxFunctionDefs",
                  "maxInstructionDefs", "maxStackElements", "maxSizeOfInstructions",
                  "maxComponentElements", "maxComponentDepth"):
        setattr(maxp, field, 1 if field == "maxZones" else 0)
    font["maxp"] = maxp
    post = font["post"]
    post.formatType = 2.0
    post.extraNames = []
    post.mapping = {}
    post.glyphOrder = order
    font.sfntVersion = "\x00\x01\x00\x00"


def write_fonts(chars: set[str], out_dir: Path, url_prefix: str) -> str:
    """为 ``chars`` 写出四个 TrueType 子集字体，返回声明它们的 @font-face 规则。

    Args:
        chars: every character the PDF will show (the page's text).
        out_dir: folder served with the page (created if missing).
        url_prefix: the URL of ``out_dir`` as the page sees it (ends with ``/``).

    Returns:
        CSS text: one @font-face rule per face, same family names as the installed fonts.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    rules = []
    for family, weight, collection, face_family in FACES:
        font = _face(NOTO_DIR / collection, face_family)
        _subset(font, chars)
        cff_to_truetype(font)
        name = f"{family.replace(' ', '')}-{weight}.ttf"
        font.save(str(out_dir / name))
        rules.append(f'@font-face {{ font-family: "{family}"; font-weight: {weight}; '
                     f'font-style: normal; src: url("{url_prefix}{name}") format("truetype"); }}')
    return "\n".join(rules)


def mathjax_faces(rules: list[dict], site: Path, root_url: str, out_dir: Path, url_prefix: str) -> str:
    """把页面里声明的 MathJax 字体（CFF 轮廓的 WOFF）转成 TrueType，返回同名的 @font-face 规则。

    Args:
        rules: the page's @font-face rules, each ``{"family": ..., "url": ...}`` (absolute URL).
        site: the folder served at ``root_url``.
        root_url: the server's root URL (ends with ``/``).
        out_dir, url_prefix: where the copies go and their URL, as in ``write_fonts``.

    Returns:
        CSS text, one rule per MathJax font (fonts that are TrueType already are left alone).
    """
    from fontTools.ttLib import TTFont

    out_dir.mkdir(parents=True, exist_ok=True)
    css = []
    for rule in rules:
        url = rule["url"]
        if not (url.startswith(root_url) and "/mathjax/" in url and url.endswith(".woff")):
            continue
        font = TTFont(str(site / url[len(root_url):]))
        if "CFF " not in font:
            continue
        cff_to_truetype(font)
        font.flavor = None
        name = Path(url).stem + ".ttf"
        font.save(str(out_dir / name))
        css.append(f'@font-face {{ font-family: {rule["family"]}; '
                   f'src: url("{url_prefix}{name}") format("truetype"); }}')
    return "\n".join(css)
