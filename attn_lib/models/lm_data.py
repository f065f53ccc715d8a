"""第 13 章（一个会写字的小模型）：用 it_data（「它」指代的数据）的句子模板造的语料，给小语言模型做「预测下一个词」。

Chapter 10's sentences (``attn_lib.models.it_data``: its classes, places, frames, held-out frames and
templates), now read left to right as next-token prediction, with a measure word before each
object in half of the sentences and a ``<bos>`` token in front::

    <bos> 桌上 有 一杯 水 和 一本 书，它 被 打翻 了。
    <bos> 厨房里 放着 报纸 跟 苹果，弟弟 刚 修好 电视，妈妈 把 它 切开 了。

The verb of 「它」's clause fits one of the two listed objects (the one 「它」 refers to, the first or
the second with equal probability), never the third object of a distractor clause. A model
that completes ``<bos> 桌上 有 一杯 水 和 一本 书 ， 它 被`` with a verb that fits 水 or 书 has to look
back at the objects; a model that only sees the previous token 被 cannot (``bigram_after``).

The held-out split uses chapter 10's held-out frames (place × existence verb × connector),
never seen in training, so a held-out prompt is a sentence start the model never read.
Tokens are words (one per vocabulary entry), as in ``it_data``; no tokenizer needed.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import torch

from . import it_data
from ..checks import check_positive_int

MEASURE_WORDS: dict[str, str] = {
    "水": "一杯", "茶": "一杯", "牛奶": "一杯", "咖啡": "一杯", "果汁": "一杯", "汤": "一碗", "酒": "一瓶", "可乐": "一瓶",
    "书": "一本", "报纸": "一份", "杂志": "一本", "信": "一封", "小说": "一本", "课本": "一本", "地图": "一张", "日记": "一本",
    "灯": "一盏", "电视": "一台", "电脑": "一台", "风扇": "一台", "收音机": "一台", "空调": "一台", "手机": "一部", "台灯": "一盏",
    "苹果": "一个", "面包": "一个", "蛋糕": "一块", "饼干": "一块", "西瓜": "一个", "包子": "一个", "饺子": "一个", "香蕉": "一根",
}
PAD, BOS = it_data.PAD, "<bos>"
VERBS: tuple[str, ...] = tuple(it_data.VERB_CLASS)
VOCAB: tuple[str, ...] = (PAD, BOS, *dict.fromkeys([*it_data.VOCAB[1:], *MEASURE_WORDS.values()]))
TOKEN_ID: dict[str, int] = {t: i for i, t in enumerate(VOCAB)}
PAD_ID, BOS_ID = TOKEN_ID[PAD], TOKEN_ID[BOS]


@dataclass(frozen=True)
class Sentence:
    """一个训练句子：词的列表（以 <bos> 开头）、列出的两个物体、「它」那一句的动词和模板信息。"""

    tokens: tuple[str, ...]
    objects: tuple[str, str]  # the two listed objects, in order
    verb: str  # the verb of 「它」's clause: it fits the object 「它」 refers to
    frame: tuple[str, str, str]
    form: str  # "被"（它 被 V 了）or "把"（S 把 它 V 了）
    distractor: bool

    @property
    def text(self) -> str:
        """整句话（不含 <bos>，词直接连起来）。"""
        return "".join(self.tokens[1:])


@dataclass(frozen=True)
class Prompt:
    """一个续写提示：到「被」为止的词（以 <bos> 开头）、列出的两个物体、有没有干扰句。"""

    tokens: tuple[str, ...]
    objects: tuple[str, str]
    distractor: bool

    @property
    def text(self) -> str:
        """提示本身（不含 <bos>）。"""
        return "".join(self.tokens[1:])


def _with_measure_words(tokens) -> list[str]:
    """Put each object's measure word in front of it (水 -> 一杯 水)."""
    out = []
    for t in tokens:
        out += [MEASURE_WORDS[t], t] if t in MEASURE_WORDS else [t]
    return out


def _sentence(rng: random.Random, frame) -> Sentence:
    ex = it_data._sentence(rng, frame)  # chapter 10's template: objects at 2 and 4, 它 at it_index
    verb = ex.tokens[ex.it_index + (2 if ex.form == "被" else 1)]
    body = _with_measure_words(ex.tokens) if rng.random() < 0.5 else list(ex.tokens)
    return Sentence((BOS, *body), (ex.tokens[2], ex.tokens[4]), verb, frame, ex.form, ex.distractor)


def make_split(split: str, n: int, *, seed: int = 0) -> list[Sentence]:
    """生成一个划分：``"train"`` 只用训练模板，``"test"`` 只用留出的模板；同一个种子结果相同。

    Args:
        split: ``"train"`` or ``"test"`` (chapter 10's held-out frames).
        n: number of distinct sentences (int >= 1).
        seed: seed of the generator (Python's ``random.Random``, independent of torch).

    Returns:
        A list of ``n`` distinct ``Sentence``.
    """
    if split not in ("train", "test"):
        raise ValueError(f'split must be "train" or "test", got {split!r}')
    check_positive_int("n", n)
    frames = it_data.TRAIN_FRAMES if split == "train" else it_data.HELD_OUT_FRAMES
    rng = random.Random(f"lm-{split}-{seed}")
    seen, out = set(), []
    while len(out) < n:
        s = _sentence(rng, rng.choice(frames))
        if s.tokens not in seen:
            seen.add(s.tokens)
            out.append(s)
    return out


def tokenize(text: str) -> list[str]:
    """把一句话切成词表里的词（每次取最长的那个词），如「桌上有一杯水」→ 桌上 有 一杯 水。"""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    longest = max(len(w) for w in VOCAB)
    words, i = [], 0
    while i < len(text):
        word = next((text[i:i + n] for n in range(longest, 0, -1) if text[i:i + n] in TOKEN_ID), None)
        if word is None or word in (PAD, BOS):
            raise ValueError(f"text must be made of the words of lm_data.VOCAB, got {text[i:i + 8]!r} at "
                             f"character {i}; e.g. lm_data.make_split('train', 1)[0].text")
        words.append(word)
        i += len(word)
    return words


def encode_tokens(tokens) -> list[int]:
    """把词的列表编成词编号的列表（不在词表里的词报 ValueError）。"""
    unknown = [t for t in tokens if t not in TOKEN_ID]
    if unknown:
        raise ValueError(f"tokens must be words of lm_data.VOCAB, got {unknown[0]!r}; split the text into its words "
                         "as lm_data.make_split does, e.g. lm_data.make_split('train', 1)[0].tokens")
    return [TOKEN_ID[t] for t in tokens]


def encode_text(text: str) -> torch.Tensor:
    """把一句话编成模型的输入：前面加 <bos>，切词，返回 (L,) 的 int64 词编号（可直接交给 ``generate``）。"""
    return torch.tensor(encode_tokens([BOS, *tokenize(text)]))  # (L,)


def decode(ids) -> list[str]:
    """把词编号（列表或一维整数张量）译回词的列表。"""
    values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    bad = [i for i in values if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(VOCAB)]
    if bad:
        raise ValueError(f"ids must be token ids in 0..{len(VOCAB) - 1}, got {bad[0]!r}")
    return [VOCAB[i] for i in values]


def encode(sentences) -> dict:
    """把句子编成张量：词编号 (N, L)（右侧补 <pad>）和长度 (N,)。

    Args:
        sentences: a list of ``Sentence`` (or of ``Prompt``: anything with ``tokens``).

    Returns:
        dict with ``ids`` (N, L) int64 and ``lengths`` (N,) int64.
    """
    if not sentences:
        raise ValueError("sentences is empty")
    L = max(len(s.tokens) for s in sentences)
    ids = torch.full((len(sentences), L), PAD_ID, dtype=torch.int64)  # (N,L)
    for i, s in enumerate(sentences):
        ids[i, : len(s.tokens)] = torch.tensor(encode_tokens(s.tokens))  # (len,)
    return {"ids": ids, "lengths": torch.tensor([len(s.tokens) for s in sentences])}  # (N,L), (N,)


def completion_prompts(split: str = "test", n: int = 500, *, seed: int = 0) -> list[Prompt]:
    """续写提示：把某个划分里「它 被 V 了。」形式的句子截到「被」为止（默认用留出的模板）。

    Args:
        split: ``"test"`` (held-out frames, the default) or ``"train"``.
        n: number of distinct prompts (int >= 1).
        seed: seed of the sentences they are cut from.

    Returns:
        ``n`` distinct ``Prompt``, half of them (about) with a distractor clause.
    """
    if split not in ("train", "test"):
        raise ValueError(f'split must be "train" or "test", got {split!r}')
    check_positive_int("n", n)
    frames = it_data.TRAIN_FRAMES if split == "train" else it_data.HELD_OUT_FRAMES
    rng = random.Random(f"lm-prompts-{split}-{seed}")
    seen, out = set(), []
    while len(out) < n:
        s = _sentence(rng, rng.choice(frames))
        cut = s.tokens[: s.tokens.index("被") + 1] if s.form == "被" else None
        if cut is not None and cut not in seen:
            seen.add(cut)
            out.append(Prompt(cut, s.objects, s.distractor))
    return out


PROMPT_ROLES = ("object", "measure_word", "distractor", "it", "bei", "rest")


def prompt_roles(prompt: Prompt) -> list[str]:
    """给提示里每个词标上角色：列出的物体、它们的量词、干扰句的动词 / 量词 / 物体、「它」、「被」、其余。"""
    roles = ["rest"] * len(prompt.tokens)
    listed = prompt.tokens.index("，")  # the two objects are listed before the first comma
    for i, t in enumerate(prompt.tokens):
        if t in it_data.CLASS_OF or t in it_data.VERB_CLASS or t in MEASURE_WORDS.values():
            kind = "object" if t in it_data.CLASS_OF else "measure_word"
            roles[i] = kind if i < listed else "distractor"  # a verb only occurs in the distractor clause
    roles[-2:] = ["it", "bei"]
    return roles


def fits(verb: str, objects) -> bool:
    """动词能不能用在这些物体中的某一个上（「打翻」配液体、「读完」配读物……）。"""
    for o in objects:
        if o not in it_data.CLASS_OF:
            raise ValueError(f"objects must be objects of it_data.OBJECTS, got {o!r}")
    return it_data.VERB_CLASS.get(verb) in {it_data.CLASS_OF[o] for o in objects}


def bigram_after(sentences, token: str = "被") -> str:
    """只看前一个词的基线：训练句子里紧跟在 token 后面出现最多的词（并列时取词表里靠前的）。

    A bigram model predicts the next token from the previous one only: after 被 its greedy
    choice is this one word whatever the objects are. Only verbs follow 被, so it is the most
    frequent verb after 被 in training, the best single guess the training counts offer to a
    model that ignores the objects. It fits a prompt when its class is one of the two listed
    classes: about half of the prompts (2 of the 4 classes are listed, at random).
    """
    counts = Counter(s.tokens[i + 1] for s in sentences for i, t in enumerate(s.tokens[:-1]) if t == token)
    if not counts:
        raise ValueError(f"token must occur in the sentences, got {token!r}")
    return max(counts, key=lambda t: (counts[t], -TOKEN_ID[t]))


__all__ = ["MEASURE_WORDS", "PAD", "BOS", "PAD_ID", "BOS_ID", "VERBS", "VOCAB", "TOKEN_ID", "Sentence", "Prompt",
           "make_split", "tokenize", "encode_tokens", "encode_text", "decode", "encode", "completion_prompts", "PROMPT_ROLES", "prompt_roles", "fits",
           "bigram_after"]
