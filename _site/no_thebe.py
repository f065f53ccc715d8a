"""离线网站:thebe 关闭时,不往页面里放 sphinx-thebe 的脚本。

Jupyter Book always loads the ``sphinx_thebe`` extension. Even with
``launch_buttons.thebe: false`` it adds two scripts to every page: an inline one that
declares ``const THEBE_JS_URL = "https://unpkg.com/..."`` and ``sphinx-thebe.js``. With
Sphinx 7 the inline script is emitted twice, so every page throws
``SyntaxError: Identifier 'THEBE_JS_URL' has already been declared``; and the page names a
CDN the offline site never reaches. Without the thebe button neither script does anything,
so this extension disconnects the sphinx-thebe handlers that add them (and the one that
writes a thebe configuration block into every page).

Loaded by ``_config.yml`` (``sphinx.local_extensions``). If ``launch_buttons.thebe`` is
ever switched on, nothing is removed.
"""
from __future__ import annotations


def _thebe_enabled(config) -> bool:
    options = config.html_theme_options or {}
    return bool((options.get("launch_buttons") or {}).get("thebe"))


def _drop_thebe_scripts(app, config) -> None:
    if _thebe_enabled(config):
        return
    for event, name in (("env-before-read-docs", "init_thebe_core"), ("doctree-resolved", "update_thebe_context")):
        for listener in list(app.events.listeners.get(event, [])):
            handler = listener.handler
            if getattr(handler, "__module__", "") == "sphinx_thebe" and handler.__name__ == name:
                app.disconnect(listener.id)


def setup(app):
    app.connect("config-inited", _drop_thebe_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
