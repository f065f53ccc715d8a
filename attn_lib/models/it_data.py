"""第 10、12、13 章（「它」指的是什么）：用模板生成的中文小数据集，给第 10、12 章的小模型和第 13 章的语料用。

Each sentence names two objects from different classes, then says something about 「它」 with a
verb that fits only one of the two classes; the target is the object 「它」 refers to::

    桌上 有 水 和 书，它 被 打翻 了。-> 水（only a liquid can be 打翻）
    厨房里 放着 书 跟 水，弟弟 刚 吃光 包子，妈妈 把 它 打翻 了。-> 水

Order and distractors vary so that position alone cannot solve it: the target is the first or
the second object with equal probability, and half of the sentences carry a distractor clause
(``弟弟 刚 吃光 包子 ，``) with a third object of a third class and a verb that fits it, so "the
nearest noun" is wrong there, and so is "any object that fits some verb in the sentence" (two
do). What works is "the object that fits the verb of 「它」's own clause" or, because the
distractor clause always comes after the two objects, "the earliest object that fits some verb"
(chapter 10 prints how often the latter and the nearest fitting object are right); either needs
word order.

The held-out split uses *frames* (place × existence verb × connector) never seen in training;
every word of a held-out frame does occur in training, in other combinations. Train and test
sentences are therefore disjoint, and so are their frames (tests/models/test_it_data.py).
Sentences are lists of tokens (words), one token per vocabulary entry; no tokenizer needed.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch

from ..checks import check_positive_int

CLASSES = {
    "液体": (("水", "茶", "牛奶", "咖啡", "果汁", "汤", "酒", "可乐"), ("打翻", "洒")),
    "读物": (("书", "报纸", "杂志", "信", "小说", "课本", "地图", "日记"), ("读完", "撕破")),
    "电器": (("灯", "电视", "电脑", "风扇", "收音机", "空调", "手机", "台灯"), ("关掉", "修好")),
    "食物": (("苹果", "面包", "蛋糕", "饼干", "西瓜", "包子", "饺子", "香蕉"), ("吃光", "切开")),
}
OBJECTS: tuple[str, ...] = tuple(o for objs, _ in CLASSES.values() for o in objs)
CLASS_OF: dict[str, str] = {o: c for c, (objs, _) in CLASSES.items() for o in objs}
VERB_CLASS: dict[str, str] = {v: c for c, (_, verbs) in CLASSES.items() for v in verbs}
PLACES = ("桌上", "厨房里", "房间里", "柜子上")
EXIST = ("有", "放着")
CONNECTORS = ("和", "跟")
SUBJECTS = ("小明", "妈妈", "弟弟", "奶奶")
FRAMES: tuple[tuple[str, str, str], ...] = tuple(itertools.product(PLACES, EXIST, CONNECTORS))
# Held out: 4 of the 16 frames, chosen so that every place, existence verb and connector still
# occurs in 3 (or 6) training frames.
HELD_OUT_FRAMES: tuple[tuple[str, str, str], ...] = (
    ("桌上", "放着", "跟"), ("厨房里", "有", "和"), ("房间里", "放着", "和"), ("柜子上", "有", "跟"),
)
TRAIN_FRAMES = tuple(f for f in FRAMES if f not in HELD_OUT_FRAMES)
PAD = "<pad>"
IT = "它"
VOCAB: tuple[str, ...] = (PAD, *dict.fromkeys(
    [*PLACES, *EXIST, *CONNECTORS, *SUBJECTS, *OBJECTS, *VERB_CLASS, "，", "。", IT, "被", "把", "了", "刚"]
))
TOKEN_ID: dict[str, int] = {t: i for i, t in enumerate(VOCAB)}


@dataclass(frozen=True)
class Example:
    """一个句子：词的列表、「它」的位置、答案（「它」指的物体）和生成它的模板信息。"""

    tokens: tuple[str, ...]
    it_index: int
    target: str
    other: str
    frame: tuple[str, str, str]
    form: str  # "被"（它 被 V 了）or "把"（S 把 它 V 了）
    distractor: bool

    @property
    def text(self) -> str:
        """整句话（词直接连起来）。"""
        return "".join(self.tokens)


def _sentence(rng: random.Random, frame) -> Example:
    place, exist, conn = frame
    c_target, c_other = rng.sample(sorted(CLASSES), 2)
    target = rng.choice(CLASSES[c_target][0])
    other = rng.choice(CLASSES[c_other][0])
    first, second = (target, other) if rng.random() < 0.5 else (other, target)
    tokens = [place, exist, first, conn, second, "，"]
    distractor = rng.random() < 0.5
    if distractor:  # a third object of a third class, with a verb that fits it
        c_third = rng.choice([c for c in sorted(CLASSES) if c not in (c_target, c_other)])
        third = rng.choice(CLASSES[c_third][0])
        tokens += [rng.choice(SUBJECTS), "刚", rng.choice(CLASSES[c_third][1]), third, "，"]
    verb = rng.choice(CLASSES[c_target][1])
    form = rng.choice(("被", "把"))
    if form == "被":
        it_index = len(tokens)
        tokens += [IT, "被", verb, "了", "。"]
    else:
        it_index = len(tokens) + 2
        tokens += [rng.choice(SUBJECTS), "把", IT, verb, "了", "。"]
    return Example(tuple(tokens), it_index, target, other, frame, form, distractor)


def make_split(split: str, n: int, *, seed: int = 0) -> list[Example]:
    """生成一个划分：``"train"`` 只用训练模板，``"test"`` 只用留出的模板；同一个种子结果相同。

    Args:
        split: ``"train"`` or ``"test"`` (the held-out frames).
        n: number of distinct sentences (int >= 1).
        seed: seed of the generator (Python's ``random.Random``, independent of torch).

    Returns:
        A list of ``n`` distinct ``Example``.
    """
    if split not in ("train", "test"):
        raise ValueError(f'split must be "train" or "test", got {split!r}')
    check_positive_int("n", n)
    frames = TRAIN_FRAMES if split == "train" else HELD_OUT_FRAMES
    rng = random.Random(f"{split}-{seed}")
    seen, out = set(), []
    while len(out) < n:
        ex = _sentence(rng, rng.choice(frames))
        if ex.tokens not in seen:
            seen.add(ex.tokens)
            out.append(ex)
    return out


def encode(examples) -> dict:
    """把句子编成张量：词编号 (N, L)（右侧补 <pad>）、长度 (N,)、「它」的位置 (N,)、答案编号 (N,)。

    Args:
        examples: a list of ``Example``.

    Returns:
        dict with ``ids`` (N, L) int64, ``lengths`` (N,), ``it_index`` (N,) and ``target``
        (N,) (index into ``OBJECTS``).
    """
    if not examples:
        raise ValueError("examples is empty")
    L = max(len(ex.tokens) for ex in examples)
    ids = torch.full((len(examples), L), TOKEN_ID[PAD], dtype=torch.int64)  # (N,L)
    for i, ex in enumerate(examples):
        ids[i, : len(ex.tokens)] = torch.tensor([TOKEN_ID[t] for t in ex.tokens])  # (len,)
    return {
        "ids": ids,
        "lengths": torch.tensor([len(ex.tokens) for ex in examples]),  # (N,)
        "it_index": torch.tensor([ex.it_index for ex in examples]),  # (N,)
        "target": torch.tensor([OBJECTS.index(ex.target) for ex in examples]),  # (N,)
    }


__all__ = ["CLASSES", "OBJECTS", "CLASS_OF", "VERB_CLASS", "FRAMES", "TRAIN_FRAMES", "HELD_OUT_FRAMES", "VOCAB",
           "TOKEN_ID", "Example", "make_split", "encode"]
