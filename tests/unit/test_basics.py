"""Dictionary lookup, similarity, worked-example data, device choice, tolerances, plotting."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import attn_lib
from attn_lib import worked_example as we
from attn_lib.tolerances import assert_close, assert_flash_rule, tolerance


def test_hard_and_soft_lookup_on_the_dictionary():
    assert attn_lib.hard_lookup("apple", we.DICTIONARY) == 10
    assert attn_lib.soft_lookup(we.FRUIT_PROPORTIONS, we.DICTIONARY) == pytest.approx(we.SOURCE_FRUIT_RESULT)
    vec = attn_lib.soft_lookup([0.25, 0.75], np.array([[1.0, 0.0], [0.0, 4.0]]))
    assert np.allclose(vec, [0.25, 3.0])


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_dot_products_agree_with_loops(lib):
    gen = np.random.default_rng(0)
    Q, K = gen.standard_normal((3, 5)), gen.standard_normal((4, 5))
    if lib == "torch":
        Q, K = torch.from_numpy(Q), torch.from_numpy(K)
    loop = [[float(sum(Q[i][d] * K[j][d] for d in range(5))) for j in range(4)] for i in range(3)]
    assert np.allclose(np.asarray(attn_lib.dot_all(Q, K)), loop)
    assert np.allclose(np.asarray(attn_lib.dot_query_keys(Q[0], K)), loop[0])
    assert float(attn_lib.dot(Q[1], K[2])) == pytest.approx(loop[1][2])
    dist = np.asarray(attn_lib.euclidean_distance(Q, K))
    assert dist.shape == (3, 4)
    assert dist[1, 2] == pytest.approx(float(np.linalg.norm(np.asarray(Q[1]) - np.asarray(K[2]))))
    assert np.asarray(attn_lib.euclidean_distance(Q[0], K)).shape == (4,)


def test_worked_example_data_is_consistent():
    assert set(we.KEYS) == set(we.VALUES) == set(we.KEY_TOKENS)
    assert all(len(v) == 4 for v in (*we.KEYS.values(), *we.VALUES.values(), we.QUERY))
    assert we.POSITIONS["打翻"] > we.POSITIONS["它"] > we.POSITIONS["书"] > we.POSITIONS["水"]
    q, k, v = we.as_tensors(torch.float32)
    assert q.shape == (1, 1, 1, 4) and k.shape == (1, 1, 3, 4) and v.dtype == torch.float32


def test_device_override(monkeypatch):
    monkeypatch.setenv("ATTN_LIB_DEVICE", "cpu")
    assert attn_lib.try_gpu() == torch.device("cpu")
    monkeypatch.delenv("ATTN_LIB_DEVICE")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert attn_lib.default_device().type == expected


def test_import_does_not_touch_cuda():
    code = "import attn_lib, torch, sys; print(torch.cuda.is_initialized()); print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_tolerance_helpers_can_fail():
    a = torch.ones(3, dtype=torch.float32)
    assert_close(a, a.double())
    with pytest.raises(AssertionError, match="differ beyond"):
        assert_close(a + 1e-3, a.double())
    assert tolerance(torch.float16)["atol"] > tolerance(torch.float32)["atol"] > tolerance("float64")["atol"]
    ref = torch.zeros(4, dtype=torch.float64)
    assert_flash_rule(ref + 1e-3, ref + 1e-3, ref)
    with pytest.raises(AssertionError, match="exceeds"):
        assert_flash_rule(ref + 1e-2, ref + 1e-3, ref)


def test_plots_use_a_cjk_font_and_label_cells():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import font_manager

    from attn_lib import plotting

    font = plotting.setup_chinese_font(force=True)
    assert font is not None, plotting.NO_FONT_MESSAGE
    path = font_manager.findfont(font_manager.FontProperties(family=font), fallback_to_default=False)
    from matplotlib.ft2font import FT2Font

    assert FT2Font(path).get_char_index(ord("水")) != 0, "chosen font has no glyph for 水"
    ax = plotting.show_heatmap(torch.tensor([[0.61, 0.06, float("-inf")]]), row_labels=["它"],
                               col_labels=list(we.KEY_TOKENS), title="注意力分数")
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["0.61", "0.06", "-∞"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["水", "书", "打翻"]
    fig = plotting.show_heatmaps(torch.rand(3, 2, 2), titles=["头 1", "头 2", "头 3"], ncols=2)
    assert len(fig.axes) == 4
    ax = plotting.bar_scores([0.61, 0.06, 0.33], list(we.KEY_TOKENS))
    assert [t.get_text() for t in ax.texts] == ["0.61", "0.06", "0.33"]
    plt.close("all")


def test_missing_font_message(monkeypatch):
    from attn_lib import fonts, plotting

    monkeypatch.setattr(fonts, "find_chinese_font", lambda: None)  # no system font and no bundled one
    with pytest.warns(UserWarning, match="fonts-noto-cjk"):
        assert plotting.setup_chinese_font(force=True) is None
    monkeypatch.undo()
    assert plotting.setup_chinese_font(force=True) is not None


def test_every_module_docstring_names_its_chapter():
    """A reader goes from a chapter to its code in one step: each module's first docstring line
    names the chapter(s) it serves (the package __init__ points to them instead)."""
    import importlib
    import pkgutil
    import re

    import attn_lib

    names = [m.name for m in pkgutil.walk_packages(attn_lib.__path__, "attn_lib.")]
    assert len(names) > 20, names
    missing = []
    for name in names:
        if name.endswith("flash_triton"):  # imported lazily with Triton; read its source instead
            doc = (Path(attn_lib.__file__).parent / "flash_triton.py").read_text(encoding="utf-8")
            first = doc.split('"""', 2)[1].splitlines()[0]
        else:
            first = (importlib.import_module(name).__doc__ or "").strip().splitlines()[0]
        if not re.search(r"第 ?[0-9]+(?:[、–-][0-9]+)* ?章", first):
            missing.append(f"{name}: {first[:40]}")
    assert not missing, "module docstrings that do not open with their chapter:\n" + "\n".join(missing)
