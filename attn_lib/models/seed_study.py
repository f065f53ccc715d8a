"""第 10–12 章（换 5 个种子重做小模型的实验）：四种模型的准确率、两个头各管什么、拿掉一个头。

``seed_study()`` trains, for every seed, four tiny models on chapter 10's data (the same 3000
training and 1000 held-out sentences for every seed; the seed sets the initial weights and the
batch order): RoPE with two heads, RoPE with one head (retrained from scratch, same width and
parameter count), the sinusoidal table and no positions (two heads each). It measures the
held-out accuracy overall, with and without a distractor sentence; and, for the two-head RoPE
model, the attention of 「它」 by role, which head is the verb head, the gap between the two
heads and the accuracy with each head zeroed (``tiny_model.without_head``, not retrained).

That is 20 trainings: minutes on 2 cores. ``scripts/make_seed_study.py`` runs it with one
thread (set by the script: the study itself changes no process-wide setting, and with 2
threads the float64 sums may differ in the last bits) and writes the rounded result to
``attn_lib/data/seed_study.json``, which ships with the package; chapters 10 and 11 read it
with ``attn_lib.data.tables.load_seed_study()``. ``tests/book/test_packaged_seed_study.py`` recomputes it and checks that the
shipped file equals the fresh result.
"""
from __future__ import annotations

from typing import Any

import torch

from . import it_data
from . import tiny_model
from ..checks import check_int, check_positive_int

SEEDS = (0, 1, 2, 3, 4)
KINDS = {"rope": ("rope", 2), "rope_one_head": ("rope", 1), "sinusoidal": ("sinusoidal", 2), "none": ("none", 2)}
SPLITS = ("all", "with_distractor", "without_distractor")  # the three held-out accuracies
DIGITS = 6  # every float is stored rounded to this many decimals


def split_accuracy(model, test_data: dict, has_distractor: torch.Tensor) -> list[float]:
    """留出集准确率：全部、有干扰句、没有干扰句，三个数。"""
    ok = tiny_model.predict(model, test_data)[0] == test_data["target"]  # (N,)
    return [float(ok.double().mean()), float(ok[has_distractor].double().mean()),
            float(ok[~has_distractor].double().mean())]


def head_measures(model, test_examples, test_data: dict) -> dict[str, Any]:
    """两个头的模型：「它」按角色分的比例 (H, R)、动词头、两个头的分配相差、拿掉每个头后的准确率。

    The verb head is the head that gives 「它」's own verb more weight; the gap is the total
    variation distance between the two heads' rows (0: the same, 1: no overlap).
    """
    roles = tiny_model.attention_by_role(test_examples, tiny_model.predict(model, test_data)[1])  # (H,R)
    verb = int(roles[:, 0].argmax())
    return {
        "roles": roles.tolist(), "verb_head": verb,
        "head_gap": 0.5 * float((roles[0] - roles[1]).abs().sum()),
        "without_verb_head": tiny_model.accuracy(tiny_model.without_head(model, verb), test_data),
        "without_other_head": tiny_model.accuracy(tiny_model.without_head(model, 1 - verb), test_data),
    }


def _rounded(value):
    if isinstance(value, dict):
        return {key: _rounded(v) for key, v in value.items()}
    if isinstance(value, float):
        return round(value, DIGITS)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def seed_study(seeds=SEEDS, *, n_train: int = 3000, n_test: int = 1000) -> dict[str, list]:
    """第 10 章的多种子实验：每个种子训练四种模型，返回只含数字的结果（每个种子一项）。

    Runs with the process's thread count as it is: set ``torch.set_num_threads(1)`` before the
    call for the numbers that ``attn_lib/data/seed_study.json`` holds (``scripts/make_seed_study.py``
    does). Takes minutes (20 trainings for 5 seeds).

    Returns:
        A dict of lists, one entry per seed: ``"seeds"``; ``"<kind>"`` for each kind of
        ``KINDS`` (``[all, with_distractor, without_distractor]`` held-out accuracies); and
        for the two-head RoPE model ``"roles"`` ((H, len(tiny_model.ROLES)) per seed),
        ``"verb_head"`` (0 or 1), ``"head_gap"``, ``"without_verb_head"`` and
        ``"without_other_head"``. Floats are rounded to ``DIGITS`` decimals.
    """
    seeds = [check_int("seed", s, 0) for s in seeds]
    if not seeds:
        raise ValueError("seeds must be a non-empty sequence of ints >= 0, got an empty one; pass e.g. range(5)")
    n_train, n_test = check_positive_int("n_train", n_train), check_positive_int("n_test", n_test)
    train_data = it_data.encode(it_data.make_split("train", n_train))
    test_examples = it_data.make_split("test", n_test)
    test_data = it_data.encode(test_examples)
    has_distractor = torch.tensor([ex.distractor for ex in test_examples])  # (N,)
    result: dict[str, list] = {"seeds": seeds, **{name: [] for name in KINDS}}
    for name in ("roles", "verb_head", "head_gap", "without_verb_head", "without_other_head"):
        result[name] = []
    for seed in result["seeds"]:
        for name, (positions, num_heads) in KINDS.items():
            model = tiny_model.build_model(positions, seed=seed, num_heads=num_heads)
            tiny_model.train(model, train_data, seed=seed)
            result[name].append(split_accuracy(model, test_data, has_distractor))
            if name == "rope":
                for key, value in head_measures(model, test_examples, test_data).items():
                    result[key].append(value)
    return _rounded(result)


__all__ = ["KINDS", "SEEDS", "SPLITS", "DIGITS", "seed_study", "split_accuracy", "head_measures"]
