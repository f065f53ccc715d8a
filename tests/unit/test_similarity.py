"""Similarity (attn_lib.core.similarity): dot products and distances, numpy and torch, against loops."""
import numpy as np
import pytest
import torch

import attn_lib


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
