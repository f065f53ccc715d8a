"""网站的中文搜索:让术语表里的每个术语在搜索索引里都是一个完整的词。

Sphinx indexes Chinese text only when ``jieba`` is installed (it splits sentences into
words with ``jieba.cut_for_search``); without it not a single Chinese word reaches
``searchindex.js``. jieba's dictionary does not know this book's terms: it cuts
注意力分数 into 注意 / 注意力 / 分数, and the search page, which looks a query up as one
word, then finds nothing for 注意力分数. This extension adds every term defined in
``glossary.md`` (and the few below) to jieba's dictionary before the index is built, so a
search for any glossary term finds the pages that use it.

Loaded by ``_config.yml`` (``sphinx.local_extensions``). A build without jieba fails
with a warning that says what to install (``make book`` builds with warnings as errors).
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from sphinx.util import logging as sphinx_logging

logger = sphinx_logging.getLogger(__name__)

# Words that are not glossary terms but that readers search for.
EXTRA_WORDS = ("主走查", "四行代码", "串行", "并行", "加权平均", "词向量", "负无穷", "矩阵乘法")

_HAN = re.compile(r"[\u4e00-\u9fff]")


def glossary_terms(text: str) -> list[str]:
    """从 glossary.md 的 ``{glossary}`` 块里取出全部术语(不缩进的行)。

    Args:
        text: the Markdown source of the glossary page.

    Returns:
        The terms in order, e.g. ``["查询", "键", ...]``.
    """
    m = re.search(r"^:::\{glossary\}\s*$(.*?)^:::\s*$", text, flags=re.M | re.S)
    if not m:
        return []
    return [line.strip() for line in m.group(1).splitlines() if line.strip() and not line[0].isspace()]


def search_words(srcdir: str | Path) -> list[str]:
    """要加进 jieba 词典的词:术语表里含汉字的术语,再加 ``EXTRA_WORDS``。"""
    path = Path(srcdir) / "glossary.md"
    terms = glossary_terms(path.read_text(encoding="utf-8")) if path.is_file() else []
    words = [t for t in terms if _HAN.search(t)] + list(EXTRA_WORDS)
    return list(dict.fromkeys(words))


def _add_words(app, config) -> None:
    if not str(config.html_search_language or config.language or "").startswith("zh"):
        return
    try:
        import jieba
    except ImportError:
        logger.warning(
            "jieba is not installed, so no Chinese word reaches the search index and the site's "
            "search finds nothing in Chinese. Install the pinned tools: pip install -r requirements.txt"
        )
        return
    jieba.setLogLevel(logging.WARNING)  # no "Building prefix dict..." chatter on stderr
    for word in search_words(app.srcdir):
        # Terms with a space (在线 Softmax) cannot be one jieba word; their parts are indexed.
        if " " not in word:
            jieba.add_word(word, freq=100000)


def setup(app):
    app.connect("config-inited", _add_words)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
