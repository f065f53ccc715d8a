"""网站上给读者的两个入口：每一章的「运行」菜单里加上魔搭 ModelScope，「下载」菜单里加上整本书的 PDF。

- ModelScope (魔搭) cannot open a notebook from a GitHub URL: the entry links its notebook page
  (``MODELSCOPE_URL``, where a free CPU instance or the free GPU quota is started), and the
  intro's 「在魔搭 ModelScope 上运行」 section says what to do there (clone, open the chapter).
  It is added to sphinx-book-theme's launch group, next to Colab and Binder, on every page
  that has that group (every chapter notebook).
- The whole book as one PDF (``make book`` builds it after the site, with ``make pdf``, and
  copies it to the site's top folder as ``PDF_NAME``): an entry in every page's download group.
  The theme's own 「.pdf」 entry beside it prints only the page being read (the browser's print
  dialog); it is renamed to say so (``PRINT_PAGE_TEXT``), so that a reader who wants the book
  takes the other entry.

Both handlers run after sphinx-book-theme's own (priority 501) and only append to its lists.
Loaded by ``_config.yml`` (``sphinx.local_extensions``).
"""
from __future__ import annotations

MODELSCOPE_URL = "https://modelscope.cn/my/mynotebook"
PDF_NAME = "book.pdf"
PRINT_PAGE_TEXT = "打印这一页（.pdf）"
PRINT_PAGE_TOOLTIP = "用浏览器打印这一页或存成 PDF：只有这一页；整本书请选「整本书 PDF」"


def _group(context, label: str):
    return next((b for b in context.get("header_buttons", []) if b.get("label") == label), None)


def add_reader_buttons(app, pagename, templatename, context, doctree):
    launch = _group(context, "launch-buttons")
    if launch is not None:
        launch["buttons"].append({
            "type": "link",
            "text": "ModelScope（魔搭）",
            "tooltip": "在魔搭 ModelScope 的免费实例里运行：打开后克隆本仓库，再打开这一章（见首页）",
            "icon": "fas fa-cloud",
            "url": MODELSCOPE_URL,
            "label": "launch-modelscope-button",
        })
    download = _group(context, "download-buttons")
    if download is not None:
        for button in download["buttons"]:
            if button.get("label") == "download-pdf-button":  # the theme's window.print()
                button.update(text=PRINT_PAGE_TEXT, tooltip=PRINT_PAGE_TOOLTIP)
        download["buttons"].append({
            "type": "link",
            "text": "整本书 PDF",
            "tooltip": "下载整本书的 PDF（离线阅读）",
            "icon": "fas fa-book",
            "url": context["pathto"](PDF_NAME, 1),
            "label": "download-book-pdf-button",
        })


def setup(app):
    app.connect("html-page-context", add_reader_buttons, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
