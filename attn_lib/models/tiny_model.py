"""第 10–12 章（一个会学习的小模型）：词向量 + 位置 + 两个头的多头注意力 + 读出层。

    x = embed(ids) (+ sinusoidal_positions)          (B, L, C)
    out = MultiHeadAttention(C, 2)(x, mask=padding)   (B, L, C); RoPE rotates q and k inside
    logits = readout(out[b, it_index[b]])             (B, n_objects): which object「它」means

One attention layer, no feed-forward block: the answer has to come through the attention
weights of the 「它」 position. Training runs in float64 with a fixed seed, so it gives the same
weights, the same accuracy and the same argmax tokens on every run. The library changes no
process-wide setting: float64 sums split over 2 threads can differ in the last bits from one
thread, so a caller who wants results that do not depend on the thread count (chapters 10 and
11, ``scripts/make_seed_study.py``, the tests) calls ``torch.set_num_threads(1)`` itself, once.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_int, check_positive_int
from ..checks.sequences import check_tiny_batch, check_train_args
from ..layers.multihead import MultiHeadAttention
from ..layers.positions import rotate, sinusoidal_positions
from ..rules.settings import layer_settings

POSITION_KINDS = ("none", "sinusoidal", "rope")
ROPE_BASE = 10000.0  # the wavelength scale of RoPE (apply_rotary's default)


class RotaryMultiHeadAttention(MultiHeadAttention):
    """带旋转位置编码的多头注意力：在 Q、K 投影之后、点积之前，把每个头的 q 和 k 按位置旋转。

    Same parameters and arguments as ``MultiHeadAttention`` (``num_kv_heads``, ``window_size``
    included; self-attention only; the head dim D = d_model / num_heads must be even). With a
    ``kv_cache`` the new tokens are at the absolute positions ``cache.seen ..`` (not
    ``len(cache)``: a sliding window's cache drops its oldest positions), so cached keys keep the
    rotation of their own positions.
    """

    rotary = True  # self-attention only, even head dim (checked by the constructor and at the door)

    def _positions(self, q, k, past: int):
        """把 q (B,H,L,D) 和 k (B,H_kv,S,D) 按绝对位置 past, past+1, ... 旋转（S = L：自注意力）。"""
        pos = torch.arange(past, past + q.shape[2], device=q.device)  # (L,)
        return rotate(q, pos, ROPE_BASE), rotate(k, pos, ROPE_BASE)  # (B,H,L,D), (B,H,S,D)


class TinyItModel(nn.Module):
    """解「它」指代的小模型：词向量、位置（无 / 正余弦 / RoPE）、两个头的注意力、读出层。

    Args:
        vocab_size: number of tokens.
        n_objects: number of possible answers (the readout's outputs).
        d_model: hidden size C.
        num_heads: H (2 in chapter 10).
        num_kv_heads: H_kv key/value heads shared by the H query heads (None = H, chapter 10's
            model; 1 = one key/value head for both query heads).
        positions: ``"none"``, ``"sinusoidal"`` (added to the embeddings) or ``"rope"``.
        max_len: longest sentence (size of the sinusoidal table).
    """

    def __init__(self, vocab_size: int, n_objects: int, *, d_model: int = 32, num_heads: int = 2,
                 positions: str = "rope", max_len: int = 64, num_kv_heads: int | None = None):
        super().__init__()
        if positions not in POSITION_KINDS:
            raise ValueError(f"positions must be one of {POSITION_KINDS}, got {positions!r}")
        vocab_size, n_objects = check_positive_int("vocab_size", vocab_size), check_positive_int("n_objects", n_objects)
        self.max_len = check_positive_int("max_len", max_len)
        self.positions = positions
        self.embed = nn.Embedding(vocab_size, d_model)  # (V) -> (C)
        cls = RotaryMultiHeadAttention if positions == "rope" else MultiHeadAttention
        self.attn = cls(d_model, num_heads, num_kv_heads=num_kv_heads)
        self.readout = nn.Linear(d_model, n_objects)  # (C) -> (n_objects)
        self.register_buffer("pe", sinusoidal_positions(max_len, d_model), persistent=False)  # (max_len,C)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, it_index: torch.Tensor):
        """前向计算：返回每句的答案打分 (B, n_objects) 和注意力分数 (B, H, L, L)（门只在这里检查一次，注意力层不再检查）。

        Args:
            ids: (B, L) token ids, right-padded.
            lengths: (B,) real lengths.
            it_index: (B,) position of「它」in each sentence.

        Returns:
            ``(logits, scores)``: (B, n_objects) and (B, H, L, L).
        """
        check_tiny_batch(ids, lengths, it_index, self.max_len if self.positions == "sinusoidal" else None)
        B, L = ids.shape
        x = self.embed(ids)  # (B,L) -> (B,L,C)
        if self.positions == "sinusoidal":
            x = x + self.pe[:L].to(x.dtype)  # (B,L,C) + (L,C) -> (B,L,C)
        keep = torch.arange(L, device=ids.device)[None, :] < lengths[:, None]  # (1,L) < (B,1) -> (B,L): real tokens
        settings = layer_settings(self.attn, L, L, self.attn.head_dim, x.dtype)
        out, scores = self.attn._forward(x, x, x, keep[:, None, None, :], True, None, settings)  # (B,L,C), (B,H,L,L)
        h = out[torch.arange(B), it_index]  # (B,L,C) -> (B,C): the position of 它
        return self.readout(h), scores  # (B,C) -> (B,n_objects)


def build_model(positions: str = "rope", *, seed: int = 0, d_model: int = 32, num_heads: int = 2,
                num_kv_heads: int | None = None) -> TinyItModel:
    """按固定种子造一个 float64 的小模型（词表和答案表来自 ``attn_lib.models.it_data``；num_kv_heads 见 ``TinyItModel``）。"""
    from . import it_data

    torch.manual_seed(seed)
    model = TinyItModel(len(it_data.VOCAB), len(it_data.OBJECTS), d_model=d_model, num_heads=num_heads,
                        positions=positions, num_kv_heads=num_kv_heads)
    return model.double()


def train(model: TinyItModel, data: dict, *, steps: int = 200, batch_size: int = 128, lr: float = 0.02,
          seed: int = 0) -> list[float]:
    """用 Adam 训练 ``steps`` 步（固定种子、float64），返回每一步的损失。

    Uses the process's thread count as it is; for results that do not depend on it, the caller
    sets ``torch.set_num_threads(1)`` once before training (chapters 10 and 11 do).

    Args:
        model: a ``TinyItModel``.
        data: ``attn_lib.models.it_data.encode(...)`` of the training split.
        steps: number of optimisation steps.
        batch_size: sentences per step (drawn with a seeded generator).
        lr: Adam's learning rate.
        seed: seed of the batch order.

    Returns:
        The training loss (cross-entropy) at every step.
    """
    steps, batch_size, lr = check_train_args(steps, batch_size, lr)

    def loss_of(idx):
        lengths = data["lengths"][idx]  # (batch,)
        logits, _ = model(data["ids"][idx, :int(lengths.max())], lengths, data["it_index"][idx])  # (batch,n_objects)
        return F.cross_entropy(logits, data["target"][idx])

    return adam_steps(model, data["ids"].shape[0], loss_of, steps=steps, batch_size=batch_size, lr=lr, seed=seed)


def adam_steps(model: nn.Module, n_items: int, loss_of, *, steps: int, batch_size: int, lr: float,
               seed: int) -> list[float]:
    """第 10、13 章共用的训练循环（参数已检查过）：每步按种子抽 batch_size 个编号 idx，用 ``loss_of(idx)`` 的损失走一步 Adam。

    Returns the loss of every step; the model is left in eval mode.
    """
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, n_items, (batch_size,), generator=g)  # (batch,)
        loss = loss_of(idx)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


@torch.no_grad()
def predict(model: TinyItModel, data: dict):
    """对一个划分做预测：返回答案编号 (N,) 和注意力分数 (N, H, L, L)。"""
    logits, scores = model(data["ids"], data["lengths"], data["it_index"])  # (N,n_objects), (N,H,L,L)
    return logits.argmax(-1), scores


def accuracy(model: TinyItModel, data: dict) -> float:
    """准确率：预测的物体等于答案的句子所占的比例。"""
    pred, _ = predict(model, data)
    return float((pred == data["target"]).double().mean())


def without_head(model: TinyItModel, head: int) -> TinyItModel:
    """去掉一个头：复制模型，把这个头的值投影清零（它的输出因此恒为 0），其余不变。

    With shared key/value heads (``num_kv_heads`` < ``num_heads``) a value head serves several
    query heads, so the query head's own output columns of ``out_proj`` are zeroed instead:
    its contribution is 0 all the same, the other heads are unchanged.
    """
    head = check_int("head", head, 0)
    if head >= model.attn.num_heads:
        raise ValueError(f"head must be an int in 0..{model.attn.num_heads - 1} (the model has "
                         f"{model.attn.num_heads} heads), got {head}")
    ablated = copy.deepcopy(model)
    attn = ablated.attn
    C, D = attn.d_model, attn.head_dim
    with torch.no_grad():
        if attn.num_kv_heads != attn.num_heads:
            attn.out_proj.weight[:, head * D:(head + 1) * D] = 0.0  # (C,C): the columns that read this head
            return ablated
        rows = slice(2 * C + head * D, 2 * C + (head + 1) * D)  # the value rows of this head in (3C, C)
        attn.qkv.weight[rows] = 0.0
        if attn.qkv.bias is not None:
            attn.qkv.bias[rows] = 0.0
    return ablated


ROLES = ("own_verb", "target", "other", "distractor_verb", "distractor_object", "it", "rest")


def token_roles(example) -> list[str]:
    """给句子里每个词标上它的角色：「它」自己那一句的动词、答案、另一个物体、干扰句的动词和物体、「它」、其余。"""
    roles = ["rest"] * len(example.tokens)
    roles[example.it_index] = "it"
    roles[example.it_index + (2 if example.form == "被" else 1)] = "own_verb"
    from .it_data import CLASS_OF

    objects = [i for i, t in enumerate(example.tokens) if t in CLASS_OF]  # 2 listed objects (+1 in a distractor)
    for i in objects[:2]:
        roles[i] = "target" if example.tokens[i] == example.target else "other"
    if example.distractor:
        roles[objects[2]] = "distractor_object"
        roles[objects[2] - 1] = "distractor_verb"
    return roles


def attention_by_role(examples, scores: torch.Tensor) -> torch.Tensor:
    """「它」的注意力按词的角色汇总：返回 (H, len(ROLES))，第 h 行是第 h 个头分给每种角色的平均比例。

    Args:
        examples: N ``it_data.Example``.
        scores: (N, H, L, L) attention scores of those sentences (``predict``).

    Returns:
        (H, len(ROLES)) float64: for each head, the weight 「它」 gives to each role, averaged
        over the sentences (each row sums to 1).
    """
    H = scores.shape[1]
    total = torch.zeros(H, len(ROLES), dtype=torch.float64)  # (H,R)
    for n, ex in enumerate(examples):
        row = scores[n, :, ex.it_index, : len(ex.tokens)].double()  # (H,len)
        for j, role in enumerate(token_roles(ex)):
            total[:, ROLES.index(role)] += row[:, j]  # (H,)
    return total / len(examples)


def object_vector_similarity(model: TinyItModel) -> dict:
    """学到的物体向量里，同类两两之间与异类两两之间的点积：平均余弦、点积为正 / 为负的比例。

    Looks at two sets of vectors, each one row per object: the input embeddings and the
    readout rows. Returns ``{name: {"same_cos", "diff_cos", "same_positive", "diff_negative"}}``.
    """
    from .it_data import CLASS_OF, OBJECTS, TOKEN_ID

    classes = [CLASS_OF[o] for o in OBJECTS]
    same = torch.tensor([[a == b for b in classes] for a in classes])  # (n,n)
    off_diag = same & ~torch.eye(len(OBJECTS), dtype=torch.bool)  # same class, different objects
    result = {}
    vectors = {"embedding": model.embed.weight[[TOKEN_ID[o] for o in OBJECTS]], "readout": model.readout.weight}
    for name, w in vectors.items():
        w = w.detach().double()  # (n,C)
        dots = w @ w.T  # (n,C) @ (C,n) -> (n,n)
        cos = F.normalize(w, dim=-1) @ F.normalize(w, dim=-1).T  # (n,n)
        result[name] = {
            "same_cos": float(cos[off_diag].mean()), "diff_cos": float(cos[~same].mean()),
            "same_positive": float((dots[off_diag] > 0).double().mean()),
            "diff_negative": float((dots[~same] < 0).double().mean()),
        }
    return result


def run_experiment(positions: str = "rope", *, seed: int = 0, n_train: int = 3000, n_test: int = 1000,
                   num_kv_heads: int | None = None) -> dict:
    """第 10 章的实验：生成数据、按种子建模型、训练，返回模型、两个划分、编码后的张量和损失曲线。

    ``num_kv_heads=1`` retrains the same model with one key/value head shared by both query heads
    (GQA / MQA); the default None is chapter 10's model, unchanged.
    """
    from . import it_data

    train_examples = it_data.make_split("train", n_train, seed=seed)
    test_examples = it_data.make_split("test", n_test, seed=seed)
    train_data, test_data = it_data.encode(train_examples), it_data.encode(test_examples)
    model = build_model(positions, seed=seed, num_kv_heads=num_kv_heads)
    losses = train(model, train_data, seed=seed)
    return {"model": model, "train": train_examples, "test": test_examples, "train_data": train_data,
            "test_data": test_data, "losses": losses}


__all__ = ["ROLES", "token_roles", "attention_by_role", "object_vector_similarity", "run_experiment",
           "TinyItModel", "RotaryMultiHeadAttention", "build_model", "train", "predict", "accuracy",
           "without_head", "POSITION_KINDS"]
