"""网站的中文搜索：术语表里的术语是完整的词，任何连续的汉字（注意力机制、查询头）也都搜得到。

Sphinx indexes Chinese text only when ``jieba`` is installed (it splits sentences into
words with ``jieba.cut_for_search``); without it not a single Chinese word reaches
``searchindex.js``. Two gaps remain with jieba alone, and this extension closes both:

- jieba's dictionary does not know this book's terms (it cuts 注意力分数 into 注意 / 注意力 /
  分数). Every term defined in ``glossary.md`` (and ``EXTRA_WORDS``) is added to jieba's
  dictionary before the index is built, so each is indexed whole; a text that holds a term
  inside a longer word (位置编码 in 旋转位置编码) is indexed under the term too.
- The search page looks each query word up as one index entry, and Sphinx drops
  one-character words from the index. A query that is not one indexed word (注意力机制,
  查询头, 分数矩阵, 显存带宽: jieba cuts them into 注意力 / 机制, 查询 / 头 ...) found nothing.
  ``BookChinese`` also indexes every single Han character and every pair of adjacent Han
  characters (``han_grams``), and its query splitter (``JS_SPLITTER``, run in the search
  page) looks a run of Han characters up whole when the index has it and otherwise as its
  overlapping pairs, all of which a page must contain. A page that contains the query finds
  it; a page that holds every pair but not in a row is found too (rare for a real term).
- Sphinx splits each text node on its own, so a word that a link or a code span cuts in two
  ({term}`查询`头 renders as 查询 inside a link, then 头) reached the index in neither half.
  ``_collect_paragraphs`` also splits every paragraph's whole text.

Loaded by ``_config.yml`` (``sphinx.local_extensions``). A build without jieba fails
with a warning that says what to install (``make book`` builds with warnings as errors).
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import sphinx.search
from docutils import nodes
from sphinx.search.zh import SearchChinese
from sphinx.util import logging as sphinx_logging

logger = sphinx_logging.getLogger(__name__)

# Words that are not glossary terms but that readers search for.
EXTRA_WORDS = ("主走查", "四行代码", "串行", "并行", "加权平均", "词向量", "负无穷", "矩阵乘法")

_HAN = re.compile(r"[\u4e00-\u9fff]")
_HAN_RUN = re.compile(r"[\u4e00-\u9fff]+")

# The search page's query splitter (Sphinx's ``splitQuery``, see ``SearchLanguage.js_splitter_code``):
# the default split on non-letters, then each run of Han characters looked up whole when the
# index has it (a glossary term, a jieba word), else as its overlapping pairs (注意力机制 ->
# 注意 意力 力机 机制), which the search page then requires all of. Latin words stay whole.
JS_SPLITTER = r"""
function splitQuery(query) {
  const index = (typeof Search !== "undefined" && Search._index) ? Search._index : null;
  const known = (w) => !!index && (Object.prototype.hasOwnProperty.call(index.terms, w)
                                   || Object.prototype.hasOwnProperty.call(index.titleterms, w));
  const out = [];
  query.split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu).filter(t => t).forEach(chunk => {
    chunk.split(/(\p{Script=Han}+)/u).filter(t => t).forEach(part => {
      if (!/\p{Script=Han}/u.test(part) || part.length <= 2 || known(part)) { out.push(part); return; }
      for (let i = 0; i + 2 <= part.length; i++) out.push(part.slice(i, i + 2));
    });
  });
  return out;
}
"""


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


def han_grams(text: str) -> list[str]:
    """文本里每个汉字，以及每两个相邻的汉字（只在连续的汉字之内）。

    Args:
        text: any text, e.g. ``"查询头（GQA）"``.

    Returns:
        The single characters, then the adjacent pairs, e.g. ``["查", "询", "头", "查询", "询头"]``.
    """
    runs = _HAN_RUN.findall(text)
    return [c for run in runs for c in run] + [run[i:i + 2] for run in runs for i in range(len(run) - 1)]


class BookChinese(SearchChinese):
    """中文搜索语言：jieba 的词、单个汉字和相邻的两个汉字都进索引，查询按 ``JS_SPLITTER`` 拆分。"""

    js_splitter_code = JS_SPLITTER
    # The glossary's Han terms (set by ``_add_words``): a text that holds one inside a longer
    # word (位置编码 in 旋转位置编码, which jieba keeps whole) is indexed under it as well.
    terms: tuple[str, ...] = ()

    def split(self, input: str) -> list[str]:  # noqa: A002 - Sphinx's signature
        inside = [t for t in self.terms if t in input]
        return super().split(input) + han_grams(input) + inside

    def word_filter(self, stemmed_word: str) -> bool:
        # Sphinx's Chinese filter drops one-character words; a Han character or a Greek
        # letter (the glossary's Θ 记号) is a word a reader may search for.
        return len(stemmed_word) > 1 or not stemmed_word.isascii()


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
    words = search_words(app.srcdir)
    for word in words:
        # Terms with a space (在线 Softmax) cannot be one jieba word; their parts are indexed.
        if " " not in word:
            jieba.add_word(word, freq=100000)
    BookChinese.terms = tuple(w for w in words if _HAN_RUN.fullmatch(w))


_sphinx_word_collector = sphinx.search.IndexBuilder._word_collector


def _collect_paragraphs(self, doctree):
    """Sphinx 的取词，再加上每个段落的全文（跨过链接和代码的边界）。"""
    store = _sphinx_word_collector(self, doctree)
    if isinstance(self.lang, BookChinese):
        for para in doctree.findall(nodes.paragraph):
            if len(para.children) > 1:  # one text node: Sphinx has split it already
                store.words.extend(self.lang.split(para.astext()))
    return store


def setup(app):
    sphinx.search.languages["zh"] = BookChinese
    sphinx.search.IndexBuilder._word_collector = _collect_paragraphs
    app.connect("config-inited", _add_words)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
