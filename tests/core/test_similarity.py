"""Similarity (attn_lib.core.similarity): dot products and distances, numpy and torch, against loops."""
import numpy as np
import pytest
import torch

import attn_lib
from attn_lib.tolerances import assert_close


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_dot_products_agree_with_loops(lib):
    gen = np.random.default_rng(0)
    Q, K = gen.standard_normal((3, 5)), gen.standard_normal((4, 5))
    if lib == "torch":
        Q, K = torch.from_numpy(Q), torch.from_numpy(K)
    loop = np.array([[float(sum(Q[i][d] * K[j][d] for d in range(5))) for j in range(4)] for i in range(3)])
    assert_close(np.asarray(attn_lib.dot_all(Q, K)), loop, dtype="float64", what="dot_all")
    assert_close(np.asarray(attn_lib.dot_query_keys(Q[0], K)), loop[0], dtype="float64", what="dot_query_keys")
    assert_close(np.float64(attn_lib.dot(Q[1], K[2])), loop[1, 2], dtype="float64", what="dot")
    dist = np.asarray(attn_lib.euclidean_distance(Q, K))
    assert dist.shape == (3, 4)
    loop_dist = np.array([[np.sqrt(sum((float(Q[i][d]) - float(K[j][d])) ** 2 for d in range(5))) for j in range(4)]
                          for i in range(3)])
    assert_close(dist, loop_dist, dtype="float64", what="euclidean_distance")
    assert np.asarray(attn_lib.euclidean_distance(Q[0], K)).shape == (4,)
    assert_close(np.asarray(attn_lib.euclidean_distance(Q[0], K)), loop_dist[0], dtype="float64")


def test_dot_of_the_worked_example_query_and_keys():
    from attn_lib.core import worked_example as we

    got = np.asarray(attn_lib.dot_query_keys(np.array(we.QUERY), np.array(we.key_matrix())))
    assert_close(got, np.array(we.SOURCE_PRINTED["dots"]), dtype="float64")
