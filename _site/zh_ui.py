"""网站界面的中文提示:补上主题的简体中文翻译里缺的几条。

sphinx-book-theme (message catalog ``booktheme``) and pydata-sphinx-theme / Sphinx (catalog
``sphinx``) translate most of their interface into zh_CN, but a few tooltips that pass
through their translation functions have no Chinese entry, so the site showed them in
English (“Launch interactive content”, “Color mode”, “Link to this heading” ...). This
extension compiles the missing entries below into a message catalog (with Babel, which
Sphinx itself depends on) and registers it with the public ``app.add_message_catalog``;
gettext consults it only for messages the theme's own catalog lacks.

The two sidebar buttons, whose titles sphinx-book-theme writes in English without a
translation function, are overridden in ``_site/templates/``.

Three more labels are written in English with no translation function at all: the
``aria-label`` that sphinx-togglebutton's script (and myst-nb, on the fold-out of a hidden
cell) gives every toggle button ("Toggle hidden content"), and sphinx-book-theme's navigation landmarks "Main" (the book's table of contents)
and "Page" (the page outline that is printed). ``OUTPUT_ZH`` replaces them in the written
files once the build has finished; a label that is no longer found fails the build, so that a
theme upgrade that renames one is noticed.

Loaded by ``_config.yml`` (``sphinx.local_extensions``).
"""
from __future__ import annotations

from pathlib import Path

MISSING_ZH = {
    "booktheme": {
        "Launch interactive content": "在线运行这一章",
        "Launch on": "运行于",
        "Search this book": "搜索本书",
        "Toggle primary sidebar": "显示或隐藏目录",
        "Toggle secondary sidebar": "显示或隐藏本页提纲",
    },
    "sphinx": {
        "Color mode": "颜色模式",
        "System Settings": "跟随系统",
        "Link to this heading": "链接到这一节",
        "Link to this definition": "链接到这个定义",
        "Link to this term": "链接到这个术语",
    },
}


# (files under the output folder, English as written, Chinese)
OUTPUT_ZH = [
    ("_static/togglebutton.js", 'aria-label="Toggle hidden content"', 'aria-label="展开或收起隐藏的内容"'),
    # myst-nb writes the same label on the fold-out of cells tagged hide-input
    ("**/*.html", '<summary aria-label="Toggle hidden content">', '<summary aria-label="展开或收起隐藏的内容">'),
    ("**/*.html", '<nav class="bd-links bd-docs-nav" aria-label="Main">',
     '<nav class="bd-links bd-docs-nav" aria-label="全书目录">'),
    ("**/*.html", '<nav aria-label="Page">', '<nav aria-label="本页提纲">'),
]


def translate_output(app, exception) -> None:
    """Replace the English labels of ``OUTPUT_ZH`` in the built site (html and singlehtml builds)."""
    if exception is not None or app.builder.format != "html":
        return
    from sphinx.errors import ExtensionError

    out = Path(app.outdir)
    for pattern, english, chinese in OUTPUT_ZH:
        found = 0
        for path in sorted(out.glob(pattern)):
            text = path.read_text(encoding="utf-8")
            if english in text:
                path.write_text(text.replace(english, chinese), encoding="utf-8")
                found += 1
            elif chinese in text:
                found += 1  # an incremental build left this file as it was
        if not found:
            raise ExtensionError(f"zh_ui: {english!r} is in no {pattern} of {out}; update OUTPUT_ZH for the new theme")


def _write_catalogs(root: Path, language: str) -> Path:
    from babel.messages.catalog import Catalog
    from babel.messages.mofile import write_mo

    for domain, messages in MISSING_ZH.items():
        catalog = Catalog(locale=language.replace("-", "_"), domain=domain)
        for msgid, msgstr in messages.items():
            catalog.add(msgid, msgstr)
        target = root / language / "LC_MESSAGES" / f"{domain}.mo"
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as f:
            write_mo(f, catalog)
    return root


def setup(app):
    language = app.config.language or "en"
    if language.startswith("zh"):
        root = _write_catalogs(Path(app.doctreedir).parent / "zh_ui_locale", language)
        for domain in MISSING_ZH:
            app.add_message_catalog(domain, str(root))
        app.connect("build-finished", translate_output)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
