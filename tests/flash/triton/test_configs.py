"""attn_lib/flash/triton/configs.py (pure Python, no Triton): the kernels' tile sizes and shared-memory estimates,
the grid chunks, when offsets need int64, and the band's kernel arguments.

The shared-memory rules are checked against formulas written out here (what stays on chip, what streams), the
sm_75 model against the bytes the sm_75 compiler reported, and the band arguments against hand-made answers."""
import pytest
import torch

from attn_lib.flash.triton import configs as cfg
from attn_lib.rules.band import Band

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def test_importing_the_configurations_does_not_need_triton():
    import subprocess
    import sys

    code = "import sys, attn_lib.flash.triton.configs\nprint('triton' in sys.modules)\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ["False"], res.stdout + res.stderr


def test_gpu_configurations_fit_shared_memory():
    for dtype in (F16, BF16, F32):
        elem = 4 if dtype == F32 else 2
        for D in (16, 20, 64, 96, 128, 256):
            for kind in ("fwd", "dq", "dkdv"):
                configs = cfg.candidate_configs(D, D, dtype, interpret=False, kind=kind)
                assert configs
                for c in configs:
                    bm, bn, bd, st = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"], c["num_stages"]
                    if kind == "fwd":  # Q_i stays, K_j and V_j stream num_stages deep
                        smem = elem * (bm * bd + st * bn * 2 * bd)
                    elif kind == "dq":  # Q_i and dO_i stay, K_j and V_j stream
                        smem = elem * (bm + st * bn) * 2 * bd
                    else:  # K_j and V_j stay, Q_i and dO_i stream
                        smem = elem * (bn + st * bm) * 2 * bd
                    assert smem <= cfg.SMEM_BUDGET, (dtype, D, kind, c)
                    assert c["BLOCK_D"] >= D and c["BLOCK_D"] & (c["BLOCK_D"] - 1) == 0
                    assert min(bm, bn, bd) >= 16
                # the OutOfResources fallback never retries an identical configuration
                assert len({tuple(sorted(c.items())) for c in configs}) == len(configs)
    # the benchmark's cases get the tutorial's large tiles
    c = cfg.default_config(64, 64, F16, interpret=False)
    assert (c["BLOCK_M"], c["BLOCK_N"], c["num_stages"]) == (128, 64, 3)
    assert cfg.default_config(128, 128, BF16, interpret=False)["BLOCK_M"] == 128
    c = cfg.default_config(64, 64, F16, interpret=False, kind="dkdv")
    assert (c["BLOCK_M"], c["BLOCK_N"]) == (32, 128)
    c = cfg.default_config(64, 64, F16, interpret=False, kind="dq")
    assert (c["BLOCK_M"], c["BLOCK_N"]) == (128, 32)


def test_the_interpreter_gets_one_small_configuration():
    for kind in ("fwd", "dq", "dkdv"):
        configs = cfg.candidate_configs(20, 40, BF16, interpret=True, kind=kind)
        assert [(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"], c["BLOCK_DV"], c["num_stages"]) for c in configs] == [
            (cfg.INTERPRET_BLOCK, cfg.INTERPRET_BLOCK, 32, 64, 1)]


def test_user_block_sizes_give_one_configuration():
    for kind in ("fwd", "dq", "dkdv"):
        configs = cfg.candidate_configs(64, 64, F16, interpret=False, kind=kind, block_m=16, block_n=32)
        assert len(configs) == 1 and (configs[0]["BLOCK_M"], configs[0]["BLOCK_N"]) == (16, 32)
        only_m = cfg.candidate_configs(64, 64, F16, interpret=False, kind=kind, block_m=16)
        assert len(only_m) == 1 and only_m[0]["BLOCK_M"] == 16
        assert only_m[0]["BLOCK_N"] == cfg.default_config(64, 64, F16, False, kind=kind)["BLOCK_N"]
    for interpret in (False, True):
        with pytest.raises(ValueError, match=r"kind must be one of \('fwd', 'dq', 'dkdv'\), got 'bwd'"):
            cfg.candidate_configs(64, 64, F16, interpret=interpret, kind="bwd")


def test_gpus_before_sm80_get_one_stage_tiles_within_64_kb():
    for kind in ("fwd", "dq", "dkdv"):
        for dtype in (F16, BF16, F32):
            for D in (16, 64, 128, 256):
                t4 = cfg.candidate_configs(D, D, dtype, interpret=False, kind=kind, capability=(7, 5))
                assert t4 and all(c["num_stages"] == 1 for c in t4)
                for c in t4:
                    if (c["BLOCK_M"], c["BLOCK_N"]) != (16, 16):  # the last resort is always offered
                        assert cfg._smem_bytes_pre_sm80(dtype, kind, c["BLOCK_M"], c["BLOCK_N"],
                                                        c["BLOCK_D"], c["BLOCK_DV"]) <= 64 * 1024
                a100 = cfg.candidate_configs(D, D, dtype, interpret=False, kind=kind, capability=(8, 0))
                assert a100 == cfg.candidate_configs(D, D, dtype, interpret=False, kind=kind)
    assert cfg.SMEM_BUDGET_PRE_SM80 == 64 * 1024


# Shared memory (bytes) of the kernels compiled for sm_75 (Colab's T4) with Triton 3.7.1's
# bundled ptxas, no GPU needed: causal, key padding, D = Dv, one stage (measured with
# `bench/gpu.py --compile-only 75 --head-dims 64 128` and the same call for the other tiles).
MEASURED_SM75 = {  # (kind, dtype, D, BLOCK_M, BLOCK_N) -> bytes
    ("fwd", F16, 64, 128, 64): 65536, ("fwd", BF16, 64, 128, 64): 81920,
    ("fwd", F16, 128, 64, 32): 49152, ("fwd", F16, 128, 32, 32): 32768,
    ("fwd", BF16, 128, 64, 32): 57344, ("fwd", BF16, 128, 32, 32): 36864,
    ("dkdv", F16, 64, 32, 128): 81920, ("dkdv", BF16, 64, 32, 64): 57344,
    ("dkdv", F16, 128, 32, 64): 81920, ("dkdv", F16, 128, 16, 32): 40960,
    ("dkdv", BF16, 128, 32, 64): 106496, ("dkdv", BF16, 128, 16, 32): 51200,
    ("dq", F16, 64, 128, 32): 81920, ("dq", BF16, 64, 64, 32): 49152,
    ("dq", F16, 128, 64, 32): 81920, ("dq", F16, 128, 32, 16): 40960,
    ("dq", BF16, 128, 64, 32): 98304, ("dq", BF16, 128, 32, 16): 49152,
    ("fwd", F16, 128, 64, 64): 65536, ("fwd", BF16, 64, 64, 64): 49152,
    ("dkdv", F16, 64, 32, 64): 40960, ("dq", F16, 64, 64, 32): 40960,
}


def test_pre_sm80_shared_memory_model_matches_the_sm75_compiler():
    for (kind, dtype, D, bm, bn), measured in MEASURED_SM75.items():
        model = cfg._smem_bytes_pre_sm80(dtype, kind, bm, bn, D, D)
        assert measured <= model <= 2 * measured, (kind, dtype, D, bm, bn, model, measured)
    for kind in ("fwd", "dq", "dkdv"):
        for dtype in (F16, BF16):
            for D in (64, 128):
                first = cfg.candidate_configs(D, D, dtype, interpret=False, kind=kind, capability=(7, 5))[0]
                measured = MEASURED_SM75.get((kind, dtype, D, first["BLOCK_M"], first["BLOCK_N"]))
                assert measured is not None and measured <= 64 * 1024, (kind, dtype, D, first)


def test_decode_configurations():
    interp = cfg.decode_configs(4, 128, 128, F16, True)
    assert [(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"]) for c in interp] == [(16, 32, 128)]
    gpu = cfg.decode_configs(4, 128, 128, F16, False)
    assert [c["BLOCK_N"] for c in gpu] == [128, 64, 32, 16]  # 128 keys first, as flash-attn's split-KV kernel
    assert cfg.decode_configs(4, 128, 128, F32, False)[0]["BLOCK_N"] == 64  # fp32: twice the bytes per key
    for rows, d, dtype in ((4, 128, F16), (4, 128, F32), (4, 256, F16), (128, 128, F16), (512, 256, F32)):
        elem = 4 if dtype == F32 else 2
        for c in cfg.decode_configs(rows, d, d, dtype, False):  # the query rows stay, one block of K and V streams
            assert elem * (c["BLOCK_M"] * d + c["BLOCK_N"] * 2 * d) <= cfg.SMEM_BUDGET
        for c in cfg.decode_configs(rows, d, d, dtype, False, capability=(7, 5)):
            assert c["num_stages"] == 1 and cfg._smem_bytes_pre_sm80(
                dtype, "fwd", c["BLOCK_M"], c["BLOCK_N"], d, d) <= cfg.SMEM_BUDGET_PRE_SM80
    assert cfg.decode_configs(24, 12, 10, F32, True)[0]["BLOCK_M"] == 32  # G·L = 24 rows, padded to 32
    assert cfg.decode_configs(512, 64, 64, F32, True)[0]["BLOCK_M"] == cfg.DECODE_MAX_ROWS  # more: row blocks
    assert cfg.decode_configs(512, 128, 128, F16, False, capability=(7, 5))[0]["BLOCK_M"] == 64  # T4: 64 KB
    assert [(c["BLOCK_M"], c["BLOCK_N"]) for c in cfg.decode_configs(4, 64, 64, F16, False, block_m=32, block_n=16)
            ] == [(32, 16)]


def test_grid_chunks_respect_cuda_grid_limits(monkeypatch):
    assert cfg.MAX_GRID_Y == 65535
    assert cfg.grid_chunks(0) == []
    assert cfg.grid_chunks(1) == [(0, 1)]
    assert cfg.grid_chunks(65535) == [(0, 65535)]
    assert cfg.grid_chunks(65536) == [(0, 65535), (65535, 1)]
    chunks = cfg.grid_chunks(1_000_000)
    assert all(count <= 65535 for _, count in chunks)
    covered = [h for start, count in chunks for h in range(start, start + count)]
    assert covered == list(range(1_000_000))  # every head exactly once, in order
    assert cfg.grid_chunks(7, limit=3) == [(0, 3), (3, 3), (6, 1)]
    monkeypatch.setattr(cfg, "MAX_GRID_Y", 2)  # read at call time (the launchers' tests lower it)
    assert cfg.grid_chunks(5) == [(0, 2), (2, 2), (4, 1)]


def test_needs_int64_when_an_offset_inside_a_head_may_reach_2_31():
    assert not cfg.needs_int64([(4096, 64, 64, 1)])  # (L, D) = (4096, 64), contiguous
    assert not cfg.needs_int64([(1 << 20, 128, 128, 1)])  # 2**27 elements per head
    assert cfg.needs_int64([(1 << 24, 128, 128, 1)])  # 2**31 elements in one head
    # (B, L, H, D) memory seen as (B, H, L, D): row stride H*D = 32768, L = 65536 -> 2**31
    assert cfg.needs_int64([(65536, 32768, 128, 1)])
    assert not cfg.needs_int64([(65536 - 512, 32768, 128, 1)])
    # masked lanes past L (up to one block) and BLOCK_D columns count too
    assert cfg.needs_int64([((1 << 31) // 1024 - 100, 1024, 1, 1)])
    assert cfg.needs_int64([(4, 64, 64, 1), (1 << 26, 64, 64, 1)])  # any tensor decides
    assert cfg.needs_int64([(4, -(1 << 30), 1, 1)])  # a negative stride counts by its size


def test_spans_are_rows_and_columns_with_their_strides():
    x = torch.empty(2, 5, 3, 7).transpose(1, 2)  # (B,H,L,D) = (2,3,5,7) over (B,L,H,D) memory
    assert cfg.spans(x, torch.empty(1, 1, 4, 6)) == [(5, 21, 7, 1), (4, 6, 6, 1)]


def _band(L, S, causal, window, offset):
    return cfg.band_args(Band.resolve(L, S, is_causal=causal, window_size=window, offset=offset), L, S)


def test_band_args_normalise_windows_wider_than_the_sequence():
    assert _band(7, 9, False, (-1, -1), 0) == {"band_lo": 0, "band_hi": 0, "HAS_LO": False, "HAS_HI": False}
    assert _band(7, 9, True, (-1, -1), 2) == {"band_lo": 0, "band_hi": 2, "HAS_LO": False, "HAS_HI": True}
    assert _band(7, 9, False, (3, 2), 0) == {"band_lo": -3, "band_hi": 2, "HAS_LO": True, "HAS_HI": True}
    # a side that every (i, j) satisfies is unbounded (no masking work): j - i >= -(L-1), j - i <= S-1
    assert _band(7, 9, False, (6, 8), 0) == {"band_lo": 0, "band_hi": 0, "HAS_LO": False, "HAS_HI": False}
    assert _band(7, 9, False, (5, 7), 0)["HAS_LO"] and _band(7, 9, False, (5, 7), 0)["HAS_HI"]
    # a side that hides everything is clamped to a small int (the kernels get int32 arguments)
    assert _band(7, 9, True, (10**12, 0), -10**12)["band_hi"] == -7
    assert _band(7, 9, False, (1, -1), 10**12)["band_lo"] == 9
    # a Band made by hand, not normalised, is clamped the same way
    assert cfg.band_args(Band(lo=10**12, hi=-10**12), 7, 9) == {"band_lo": 9, "band_hi": -7, "HAS_LO": True,
                                                                 "HAS_HI": True}


def test_key_mask_scale_and_block_arguments():
    dummy = torch.empty(0)
    assert cfg.key_mask_args(None, dummy) == (dummy, (0, 0))  # never read: HAS_KPM is False
    mask = torch.tensor([[True, False, True], [False, False, True]])
    kpm, strides = cfg.key_mask_args(mask, dummy)
    assert kpm.dtype == torch.int8 and kpm.tolist() == [[1, 0, 1], [0, 0, 1]] and strides == (3, 1)
    assert cfg.scale_args((0.5, 1.0)) == {"qk_scale": 0.5, "SPLIT_SCALE": False}
    assert cfg.scale_args((3e38, 1.4426950408889634)) == {"qk_scale": 3e38, "SPLIT_SCALE": True}
    c = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_D=64, BLOCK_DV=16, num_warps=4, num_stages=2)
    assert cfg.block_args({**c, "extra": 1}) == c


def test_next_pow2():
    assert [cfg.next_pow2(n) for n in (0, 1, 2, 3, 16, 17, 255, 256, 257)] == [1, 1, 2, 4, 16, 32, 256, 256, 512]
