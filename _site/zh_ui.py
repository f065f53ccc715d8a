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
    return {"parallel_read_safe": True, "parallel_write_safe": True}
