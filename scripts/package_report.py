"""Print the package's structure as measured from its source and from live calls.

    .venv/bin/python scripts/package_report.py

- the modules of each subpackage;
- the import circles between modules and between folders (expected: none);
- the largest module and the longest function (Triton kernels included);
- for each public entry, how many times one call enters the check package attn_lib.checks;
- the longest signature of a non-public function (Triton kernels excluded).

The rules these numbers are held to are tests/topics/test_package_structure.py and tests/topics/test_doors.py.
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

import attn_lib  # noqa: E402
from package_graph import (check_entries, cycles, folder_graph, functions, graph, is_internal, line_count,  # noqa: E402
                           modules, parameters)


def entry_calls() -> dict:
    """One small call of every public entry the issue names (CPU tensors; Triton under its interpreter)."""
    from attn_lib.models import it_data, lm_data, tiny_lm, tiny_model

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))  # (B,H,L,D)
    out, lse = attn_lib.flash_attention_torch(q, k, v)
    x = torch.randn(1, 3, 8, generator=g)  # (B,L,C)
    mha, sa, looped = attn_lib.MultiHeadAttention(8, 2, is_causal=True), attn_lib.SelfAttention(8), \
        attn_lib.LoopedMultiHeadAttention(8, 2)
    lm = tiny_lm.build_lm()
    ids = torch.tensor([[lm_data.BOS_ID, 5, 6]])
    tm = tiny_model.build_model()
    data = it_data.encode(it_data.make_split("train", 4, seed=0))
    return {
        "attention": lambda: attn_lib.attention(q, k, v, is_causal=True),
        "flash_attention (torch)": lambda: attn_lib.flash_attention(q, k, v, is_causal=True, backend="torch"),
        "flash_attention (triton)": lambda: attn_lib.flash_attention(q, k, v, is_causal=True, backend="triton"),
        "flash_attention_torch": lambda: attn_lib.flash_attention_torch(q, k, v, is_causal=True),
        "flash_attention_torch_backward": lambda: attn_lib.flash_attention_torch_backward(q, k, v, out, lse, q),
        "flash_attention_triton": lambda: attn_lib.flash_attention_triton(q, k, v, is_causal=True),
        "flash_decoding": lambda: attn_lib.flash_decoding(q[:, :, :1], k, v),
        "naive_attention": lambda: attn_lib.naive_attention(q, k, v, is_causal=True),
        "SelfAttention.forward": lambda: sa(x),
        "MultiHeadAttention.forward": lambda: mha(x),
        "MultiHeadAttention.forward (kv_cache)": lambda: mha(x, kv_cache=attn_lib.KVCache()),
        "LoopedMultiHeadAttention.forward": lambda: looped(x),
        "TinyLM.forward (kv_caches)": lambda: lm(ids, [attn_lib.KVCache() for _ in lm.blocks]),
        "TinyItModel.forward": lambda: tm(data["ids"], data["lengths"], data["it_index"]),
        "generate (8 tokens)": lambda: attn_lib.generate(lm, ids, 8),
    }


def main() -> None:
    mods = modules()
    per_folder = Counter(name.rsplit(".", 1)[0] if mods[name].name != "__init__.py" else name for name in mods)
    print("modules per subpackage (its __init__ included):")
    for folder, n in sorted(per_folder.items()):
        print(f"  {folder}: {n}")
    print(f"import circles: {len(cycles(graph()))} between modules, {len(cycles(folder_graph()))} between folders")
    biggest = max(mods, key=lambda m: line_count(mods[m]))
    print(f"largest module: {biggest} ({line_count(mods[biggest])} lines)")
    longest = max(functions(), key=lambda f: f[2].end_lineno - f[2].lineno + 1)
    print(f"longest function: {longest[0]}.{longest[1]} ({longest[2].end_lineno - longest[2].lineno + 1} lines"
          f"{', a Triton kernel' if longest[3] else ''})")
    widest = max((f for f in functions() if not f[3] and is_internal(f[0], f[1])), key=lambda f: parameters(f[2]))
    print(f"longest non-public signature: {widest[0]}.{widest[1]} ({parameters(widest[2])} parameters)")
    print("entries into attn_lib.checks per call:")
    with torch.no_grad():
        for name, call in entry_calls().items():
            call()  # warm up: first-call imports are not the entry's path
            print(f"  {name}: {check_entries(call)}")


if __name__ == "__main__":
    main()
