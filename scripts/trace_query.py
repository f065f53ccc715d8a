"""Follow one call of MultiHeadAttention.forward and count the attn_lib modules it passes.

Prints, for a few layer configurations: how many attn_lib modules the call's frames pass
through (the check package attn_lib.checks counted as one), how many stays (changes of
module along the way), and how often the call enters the check package. Run:

    .venv/bin/python scripts/trace_query.py          # attn_lib modules only
    .venv/bin/python scripts/trace_query.py ""       # every module, torch's included
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

import attn_lib  # noqa: E402
from package_graph import trace_call  # noqa: E402

PREFIX = sys.argv[1] if len(sys.argv) > 1 else "attn_lib"


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)  # (B,L,C)
    cases = [("default (auto -> sdpa)", attn_lib.MultiHeadAttention(8, 2), {}),
             ("causal + key padding", attn_lib.MultiHeadAttention(8, 2, is_causal=True),
              {"mask": attn_lib.padding_mask([5, 3])}),
             ("need_weights=True", attn_lib.MultiHeadAttention(8, 2), {"need_weights": True}),
             ("backend='torch', causal", attn_lib.MultiHeadAttention(8, 2, is_causal=True, backend="torch"), {})]
    for label, layer, kw in cases:
        with torch.no_grad():
            layer(x, **kw)  # warm up: first-call imports are not the layer's path
            modules, stays, entries = trace_call(lambda: layer(x, **kw), PREFIX)
        print(f"{label}: {len(modules)} modules, {stays} stays, {entries} entries into the check package")
        print("    " + ", ".join(modules))


if __name__ == "__main__":
    main()
