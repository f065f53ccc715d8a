"""第 13 章（一个会写字的小模型）：只有解码器的因果语言模型，用书里的零件搭成，在 CPU 上就能训完（第 13 章打印训练用了多久）。

    x = embed(ids)                                   (B, L, C)  token embedding, no position table
    for each block:                                  pre-norm, residual connections
        x = x + attn(norm1(x))                       causal RoPE attention (GQA allowed)
        x = x + mlp(norm2(x))                        C -> 4C -> C per position
    logits = readout(norm(x))                        (B, L, V)  a score for every next token

Positions come from RoPE inside the attention layers (``RotaryMultiHeadAttention`` of chapter
10 with ``is_causal=True``), so the model has no structural length limit (how well it writes past
the lengths it was trained on is another matter). ``forward(ids, kv_caches)`` with
one ``KVCache`` per block computes only the new tokens (``attn_lib.generate``); a forward that
fails in any block leaves every cache as it was. ``forward`` checks its input once, at its door
(``attn_lib.checks.lm.check_lm_call``); the blocks below it run unchecked (``Block._run``,
``MultiHeadAttention._forward``), and ``generate`` calls ``TinyLM._run`` step by step. Training runs
in float64 with a fixed seed, as chapter 10's model does; the caller sets
``torch.set_num_threads(1)`` for results that do not depend on the thread count.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_positive_int
from ..checks.lm import check_lm_call, check_prompts
from ..checks.sequences import check_train_args
from ..rules.settings import layer_settings
from . import lm_data
from .tiny_model import RotaryMultiHeadAttention, adam_steps


class RMSNorm(nn.Module):
    """均方根归一化（RMSNorm）：把每个位置的向量除以它的均方根，再乘一个可学的逐维增益。

    ``y = x / sqrt(mean(x²) + eps) · weight`` over the last axis (Llama's normalisation; unlike
    LayerNorm it subtracts no mean and has no bias). It keeps the input of every attention and
    MLP at the same scale however the residual stream grows.
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # (C,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., C) → (..., C)。"""
        inv_rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)  # (...,C) -> (...,1)
        return x * inv_rms * self.weight  # (...,C) * (...,1) * (C,) -> (...,C)


class MLP(nn.Module):
    """逐位置的前馈网络：C → 4C，GELU，再 4C → C；每个位置各算各的，位置之间不交换信息。

    Attention moves information between positions; this block transforms what each position
    holds (GPT-2's feed-forward block, as in nanoGPT).
    """

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(d_model, hidden)  # (C) -> (4C)
        self.down = nn.Linear(hidden, d_model)  # (4C) -> (C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, L, C) → (B, L, C)。"""
        return self.down(F.gelu(self.up(x)))  # (B,L,C) -> (B,L,4C) -> (B,L,C)


class Block(nn.Module):
    """一个解码器块（前置归一化）：x + attn(norm(x))，再 x + mlp(norm(x))。

    Each sub-layer reads a normalised copy of the residual stream x and adds its result back
    (residual connection): a block adds a correction to its input, and gradients reach the
    embedding through the additions unchanged. (At initialisation the corrections are not small:
    chapter 13 measures each branch at about a fifth to a quarter of the stream's norm.)
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None, mlp_hidden: int):
        super().__init__()
        self.norm1 = RMSNorm(d_model)
        self.attn = RotaryMultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads, is_causal=True)
        self.norm2 = RMSNorm(d_model)
        self.mlp = MLP(d_model, mlp_hidden)

    def forward(self, x: torch.Tensor, kv_cache=None, need_weights: bool = False):
        """一个块的前向计算：返回新的 x (B, L, C) 和注意力分数 (B, H, L, S)（不要时为 None）；注意力层在它的门检查 x。"""
        a = self.attn(self.norm1(x), kv_cache=kv_cache, need_weights=need_weights)  # (B,L,C)
        return self._residual(x, a, need_weights)

    def _run(self, x: torch.Tensor, kv_cache, need_weights: bool):
        """forward without checks (TinyLM's door checked the ids and every cache): x (B, L, C) -> (x, scores)."""
        h, attn = self.norm1(x), self.attn  # (B,L,C)
        L = h.shape[1]
        S = L + (0 if kv_cache is None else len(kv_cache))
        settings = layer_settings(attn, L, S, attn.head_dim, attn.out_proj.weight.dtype, cached=kv_cache is not None)
        a = attn._forward(h, h, h, None, need_weights, kv_cache, settings)  # (B,L,C) or ((B,L,C), (B,H,L,S))
        return self._residual(x, a, need_weights)

    def _residual(self, x, a, need_weights: bool):
        a, scores = a if need_weights else (a, None)  # (B,L,C), (B,H,L,S) or None
        x = x + a  # (B,L,C)
        return x + self.mlp(self.norm2(x)), scores  # (B,L,C)


class TinyLM(nn.Module):
    """小语言模型：词向量、若干个解码器块（因果 RoPE 注意力 + MLP）、最后的归一化和读出层。

    Args:
        vocab_size: number of tokens V.
        d_model: hidden size C.
        num_layers: number of blocks.
        num_heads: H query heads per attention layer (C / H must be even, for RoPE).
        num_kv_heads: H_kv key/value heads (GQA; None = H).
        mlp_hidden: hidden size of each MLP (None = 4C).
    """

    def __init__(self, vocab_size: int, *, d_model: int = 32, num_layers: int = 2, num_heads: int = 4,
                 num_kv_heads: int | None = 2, mlp_hidden: int | None = None):
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        d_model, num_layers = check_positive_int("d_model", d_model), check_positive_int("num_layers", num_layers)
        mlp_hidden = 4 * d_model if mlp_hidden is None else check_positive_int("mlp_hidden", mlp_hidden)
        self.embed = nn.Embedding(vocab_size, d_model)  # (V) -> (C)
        self.blocks = nn.ModuleList(Block(d_model, num_heads, num_kv_heads, mlp_hidden) for _ in range(num_layers))
        self.norm = RMSNorm(d_model)
        self.readout = nn.Linear(d_model, vocab_size, bias=False)  # (C) -> (V)

    def forward(self, ids: torch.Tensor, kv_caches=None, *, need_weights: bool = False):
        """前向计算：每个位置给出下一个词的打分 (B, L, V)。

        Args:
            ids: (B, L) token ids in 0 .. V - 1 (right padding is harmless: causal).
            kv_caches: None, or one ``KVCache`` per block (``len(model.blocks)``): the ids are
                then the next L tokens after the cached ones, at positions ``cache.seen ..``.
            need_weights: also return every block's attention scores (the reference path).

        Returns:
            logits (B, L, V), or ``(logits, scores)`` with scores a list of (B, H, L, S), one per block.
        """
        check_lm_call(self, ids, kv_caches, need_weights)  # every cache, before any block appends
        return self._run(ids, kv_caches, need_weights)

    def _run(self, ids: torch.Tensor, kv_caches=None, need_weights: bool = False):
        """forward 的无检查内核：任何一个块失败时，每个缓存都回到调用前的样子。"""
        states = None if kv_caches is None else [cache.state() for cache in kv_caches]
        try:
            x = self.embed(ids.long())  # (B,L) -> (B,L,C)
            scores = []
            for i, block in enumerate(self.blocks):
                x, s = block._run(x, None if kv_caches is None else kv_caches[i], need_weights)  # (B,L,C)
                scores.append(s)
            logits = self.readout(self.norm(x))  # (B,L,C) -> (B,L,V)
        except BaseException:
            for cache, state in zip(kv_caches or (), states or ()):
                cache.restore(state)  # a block that failed after an earlier one stored: undo them all
            raise
        return (logits, scores) if need_weights else logits


def build_lm(*, seed: int = 0, **sizes) -> TinyLM:
    """按固定种子造一个 float64 的小语言模型（词表来自 ``attn_lib.models.lm_data``；sizes 见 ``TinyLM``）。"""
    torch.manual_seed(seed)
    return TinyLM(len(lm_data.VOCAB), **sizes).double()


def train_lm(model: TinyLM, data: dict, *, steps: int = 300, batch_size: int = 64, lr: float = 0.01,
             seed: int = 0) -> list[float]:
    """用 Adam 训练 ``steps`` 步（固定种子、float64）：每个位置预测下一个词，返回每一步的损失。

    The loss is the cross-entropy of every next token, <pad> targets left out. Uses the
    process's thread count as it is (the caller sets ``torch.set_num_threads(1)``).

    Args:
        model: a ``TinyLM``.
        data: ``attn_lib.models.lm_data.encode(...)`` of the training sentences.
        steps: number of optimisation steps.
        batch_size: sentences per step (drawn with a seeded generator).
        lr: Adam's learning rate.
        seed: seed of the batch order.

    Returns:
        The training loss at every step.
    """
    steps, batch_size, lr = check_train_args(steps, batch_size, lr)

    def loss_of(idx):
        ids = data["ids"][idx, : int(data["lengths"][idx].max())]  # (batch,L)
        logits = model(ids[:, :-1])  # (batch,L-1) -> (batch,L-1,V)
        targets = ids[:, 1:].flatten()  # (batch,L-1) -> (batch·(L-1),): the next token at every position
        return F.cross_entropy(logits.flatten(0, 1), targets, ignore_index=lm_data.PAD_ID)  # (batch·(L-1),V)

    return adam_steps(model, data["ids"].shape[0], loss_of, steps=steps, batch_size=batch_size, lr=lr, seed=seed)


@torch.no_grad()
def complete_verbs(model: TinyLM, prompts) -> list[str]:
    """贪心续写一个词：每个提示（到「被」为止）之后打分最高的词，也就是 ``generate`` 的第一个新词。

    All prompts go in one padded batch; causal attention makes the padding after a prompt
    invisible to its last position, whose logits choose the word.
    """
    check_prompts(prompts, lm_data.Prompt)
    data = lm_data.encode(prompts)
    logits = model(data["ids"])  # (N,L) -> (N,L,V)
    last = logits[torch.arange(len(prompts)), data["lengths"] - 1]  # (N,L,V) -> (N,V)
    return [lm_data.VOCAB[i] for i in last.argmax(-1).tolist()]


def completion_rate(model: TinyLM, prompts) -> float:
    """续写出的词能用在提示里两个物体之一上的比例（``lm_data.fits``）。"""
    verbs = complete_verbs(model, prompts)
    return sum(lm_data.fits(v, p.objects) for v, p in zip(verbs, prompts)) / len(prompts)


def baseline_rate(train_sentences, prompts) -> tuple[str, float]:
    """不看物体的基线：总是续写训练句里「被」后面最常见的词（二元模型的贪心选择），返回（这个词，比例）。"""
    check_prompts(prompts, lm_data.Prompt)
    verb = lm_data.bigram_after(train_sentences, "被")
    return verb, sum(lm_data.fits(verb, p.objects) for p in prompts) / len(prompts)


@torch.no_grad()
def verb_step_attention(model: TinyLM, prompt) -> torch.Tensor:
    """写出动词的那一步（提示的最后一个位置）对前面每个词的注意力，每层每个头一行。

    Args:
        model: a ``TinyLM``.
        prompt: one ``lm_data.Prompt`` (or a list of tokens).

    Returns:
        float64 (num_layers, H, L): row [layer, h] is head h's attention scores (sum 1) over
        the L prompt tokens, from the reference path (``need_weights=True``).
    """
    tokens = prompt.tokens if isinstance(prompt, lm_data.Prompt) else tuple(prompt)
    ids = torch.tensor([lm_data.encode_tokens(tokens)])  # (1,L)
    _, scores = model(ids, need_weights=True)  # list of (1,H,L,L)
    return torch.stack([s[0, :, -1] for s in scores]).double()  # num_layers x (H,L) -> (layers,H,L)


def verb_step_attention_by_role(model: TinyLM, prompts) -> torch.Tensor:
    """写动词那一步的注意力按词的角色汇总，每层每个头一行、每种角色一列（角色见 ``lm_data.PROMPT_ROLES``）。

    For each prompt, the weight each head of each block gives to the tokens of each role
    (``lm_data.prompt_roles``: the two listed objects, their measure words, the distractor
    clause, 它, 被, the rest), summed over the tokens of that role and averaged over the
    prompts: a float64 (num_layers, H, len(PROMPT_ROLES)) tensor whose rows sum to 1.
    """
    check_prompts(prompts, lm_data.Prompt)
    total = None
    for p in prompts:
        w = verb_step_attention(model, p)  # (layers,H,L)
        by_role = torch.zeros(*w.shape[:2], len(lm_data.PROMPT_ROLES), dtype=torch.float64)  # (layers,H,R)
        for j, role in enumerate(lm_data.prompt_roles(p)):
            by_role[..., lm_data.PROMPT_ROLES.index(role)] += w[..., j]  # (layers,H)
        total = by_role if total is None else total + by_role
    return total / len(prompts)


def run_lm_experiment(*, seed: int = 0, n_train: int = 3000, n_prompts: int = 500, steps: int = 300) -> dict:
    """第 13 章的实验：造语料、按种子建模型、训练，返回模型、语料、留出的提示、损失、续写正确率和基线。"""
    train = lm_data.make_split("train", n_train, seed=seed)
    prompts = lm_data.completion_prompts("test", n_prompts, seed=seed)
    model = build_lm(seed=seed)
    losses = train_lm(model, lm_data.encode(train), steps=steps, seed=seed)
    verb, base = baseline_rate(train, prompts)
    return {"model": model, "train": train, "prompts": prompts, "losses": losses,
            "rate": completion_rate(model, prompts), "baseline_verb": verb, "baseline_rate": base}


__all__ = ["RMSNorm", "MLP", "Block", "TinyLM", "build_lm", "train_lm", "complete_verbs", "completion_rate",
           "baseline_rate", "verb_step_attention", "verb_step_attention_by_role", "run_lm_experiment"]
