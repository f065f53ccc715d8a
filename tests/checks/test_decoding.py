"""attn_lib.checks.decoding: the door of ``flash_decoding`` and the checks of the split helpers.

Each mistake is compared with its whole message written out here; the door's settings with the values the
call asked for. The kernel backend's rules are checked on the door itself with the package's presence and
the process's interpreter mode given (no kernel runs); a tensor subclass that reports ``is_cuda`` stands in
for a GPU tensor where only that flag is read.
"""
import re

import pytest
import torch

import attn_lib
import attn_lib.checks.flash as flash_checks
from attn_lib.checks.decoding import check_decode_call
from attn_lib.flash.splits import choose_num_splits, merge_partials
from attn_lib.rules.settings import Options


class ClaimsCuda(torch.Tensor):
    """A CPU tensor that says it lives on a GPU (the door reads only ``is_cuda`` to choose the backend)."""

    @property
    def is_cuda(self):
        return True


def _cache(B=2, H=2, S=6, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, 1, D, generator=g)  # (B,H,1,D)
    k = torch.randn(B, H, S, D, generator=g)  # (B,H,S,D)
    v = torch.randn(B, H, S, D, generator=g)  # (B,H,S,Dv)
    return q, k, v


def _message(call):
    with pytest.raises((TypeError, ValueError, ImportError)) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("name,args", [("block_n", (4, 64, 2, 0, 1)), ("min_blocks", (4, 64, 2, 16, 0))])
def test_the_split_rule_names_the_argument_it_refuses(name, args):
    batch_heads, S, workers, block_n, min_blocks = args
    got = _message(lambda: choose_num_splits(batch_heads, S, workers=workers, block_n=block_n, min_blocks=min_blocks))
    assert got == f"{name} must be a positive int, got 0"


def test_the_cache_tensors_are_named_as_flash_decoding_names_them():
    q, kc, vc = _cache()
    assert _message(lambda: attn_lib.flash_decoding(q, kc, vc[:, :, :5])) == (
        "k_cache and v_cache must have the same number of keys S (axis 2): k_cache has S=6, v_cache has S=5. "
        "Each key needs exactly one value.")
    assert _message(lambda: attn_lib.flash_decoding(q, kc, vc.long())).startswith(
        "v_cache must be a floating-point tensor (float16/bfloat16/float32/float64), got torch.int64")


def test_new_keys_of_the_wrong_rank_are_named_with_their_layout():
    q, kc, vc = _cache()
    k, v = torch.zeros(2, 2, 4), torch.zeros(2, 2, 1, 4)
    got = _message(lambda: attn_lib.flash_decoding(q, kc, vc, k, v, cache_seqlens=torch.tensor([1, 2])))
    assert got == ("k must be 4-D (B, H_kv, S_new, D), got 3-D with shape (2, 2, 4). For a single head, add the "
                   "head axis: k.unsqueeze(1).")
    got = _message(lambda: attn_lib.flash_decoding(q, kc, vc, v, k, cache_seqlens=torch.tensor([1, 2])))
    assert got.startswith("v must be 4-D (B, H_kv, S_new, D), got 3-D")


@pytest.mark.parametrize("which", ["k", "v"])
def test_new_keys_on_another_device_name_the_cache_and_both_tensors(which):
    q, kc, vc = _cache()
    new = {"k": torch.zeros(2, 2, 1, 4), "v": torch.zeros(2, 2, 1, 4)}
    new[which] = torch.empty(2, 2, 1, 4, device="meta")
    devices = {"k": "cpu, meta, cpu", "v": "cpu, cpu, meta"}[which]
    got = _message(lambda: attn_lib.flash_decoding(q, kc, vc, new["k"], new["v"], cache_seqlens=torch.tensor([1, 2])))
    assert got == f"k_cache, k and v must be on one device, got {devices}; move them with .to(k_cache.device)"


@pytest.mark.parametrize("which", ["k", "v"])
def test_nan_in_a_new_key_or_value_names_it(which):
    q, kc, vc = _cache()
    new = {"k": torch.zeros(2, 2, 1, 4), "v": torch.zeros(2, 2, 1, 4)}
    new[which][1, 0, 0, 2] = float("nan")
    got = _message(lambda: attn_lib.flash_decoding(q, kc, vc, new["k"], new["v"], cache_seqlens=torch.tensor([1, 2])))
    assert got == (f"{which} contains nan or inf; attention would turn it into nan. "
                   "Check the layer that produced it (masks belong in `mask`, not in q/k/v).")


def test_the_scan_of_the_read_positions_builds_its_index_on_the_cache_device():
    """Under a meta default device a tensor made without an explicit device lands on meta: the scan of the
    positions a step reads must still run on the cache's device, and still tell read from unread."""
    q, kc, vc = _cache()
    kc[0, 1, 5, 0] = float("nan")  # entry 0 reads keys 0..3 only: the nan is in its unread tail
    lengths = torch.tensor([4, 5], dtype=torch.int32)
    with torch.device("meta"):
        settings = check_decode_call(q, (kc, vc), (None, None), Options(cache_seqlens=lengths), None)
        assert torch.equal(settings.seqlens, lengths)
        kc[0, 1, 2, 0] = float("nan")  # now inside what entry 0 reads
        got = _message(lambda: check_decode_call(q, (kc, vc), (None, None), Options(cache_seqlens=lengths), None))
    assert got.startswith("k_cache contains nan or inf in the positions the step reads (keys 0 .. cache_seqlens[b] - 1")


def test_the_door_keeps_the_number_of_splits_it_was_given():
    q, kc, vc = _cache()
    assert check_decode_call(q, (kc, vc), (None, None), Options(num_splits=3), None).num_splits == 3
    assert check_decode_call(q, (kc, vc), (None, None), Options(num_splits=0), None).num_splits is None


def test_auto_takes_the_kernels_for_a_gpu_query_when_they_are_installed(kernels_present, monkeypatch):
    q, kc, vc = _cache()
    gpu_q = q.as_subclass(ClaimsCuda)
    interpreter = lambda: True  # noqa: E731 (the process runs the kernels under the interpreter: CPU tensors pass)
    assert check_decode_call(gpu_q, (kc, vc), (None, None), Options(), interpreter).backend == "triton"
    assert check_decode_call(q, (kc, vc), (None, None), Options(), interpreter).backend == "torch"
    monkeypatch.setattr(flash_checks, "triton_available", lambda: False)
    assert check_decode_call(gpu_q, (kc, vc), (None, None), Options(), interpreter).backend == "torch"


def test_the_kernel_backend_is_kept_and_its_limits_are_checked(kernels_present):
    q, kc, vc = _cache()
    options = Options(backend="triton", num_splits=2, is_causal=True)
    settings = check_decode_call(q, (kc, vc), (None, None), options, lambda: True)
    assert (settings.backend, settings.num_splits, settings.is_causal) == ("triton", 2, True)
    q64, kc64, vc64 = q.double(), kc.double(), vc.double()
    got = _message(lambda: check_decode_call(q64, (kc64, vc64), (None, None), options, lambda: True))
    assert got == ("the Triton kernel takes float16, bfloat16 or float32; for float64 use backend='torch' "
                   "(got torch.float64)")
    got = _message(lambda: check_decode_call(q, (kc, vc), (None, None), options, lambda: False))  # compiled kernels
    assert got.startswith("backend='triton' got tensors on cpu, but Triton in this process compiles GPU kernels")
    wide = [torch.zeros(1, 1, n, 257) for n in (1, 3, 3)]
    got = _message(lambda: check_decode_call(wide[0], tuple(wide[1:]), (None, None), options, lambda: True))
    assert got == "the Triton kernel supports head dims up to 256, got D=257, Dv=257; use backend='torch'"


def test_merge_partials_words_each_mistake():
    outs, lses = torch.zeros(2, 3, 4), torch.zeros(2, 3)
    assert _message(lambda: merge_partials(outs, torch.zeros(2, 4))) == (
        "outs must have shape (..., P, Dv) with lses of shape (..., P), got outs (2, 3, 4) and lses (2, 4); pass one "
        "output row and one log-sum-exp per split (the split axis last in lses, second to last in outs)")
    assert _message(lambda: merge_partials(outs, torch.empty(2, 3, device="meta"))) == (
        "lses must be on outs' device cpu, got meta; move it with lses.to(outs.device)")
    bad = lses.clone()
    bad[1, 2] = float("inf")
    assert _message(lambda: merge_partials(outs, bad)) == (
        "lses must be finite or -inf (-inf: a split that sees no key), got nan or +inf; the scores of that split "
        "overflowed: compute it in float64 or with a smaller scale")
    assert re.fullmatch(r"outs must hold at least one split \(P >= 1\), got P=0 .*",
                        _message(lambda: merge_partials(torch.zeros(2, 0, 4), torch.zeros(2, 0))))
