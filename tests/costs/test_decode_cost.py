"""attn_lib.costs.decode_cost: bytes and FLOPs of a decode step: every expected value is literal
arithmetic written out here, never taken from the module."""
import pytest

from attn_lib.costs import decode_cost
from attn_lib.costs.decode_cost import GPUS, GpuSpec, StepCost, decode_step_cost, prefill_cost
from attn_lib.tolerances import assert_close


def test_datasheet_figures():
    """The cited figures (module docstring): dense fp16/bf16 TFLOP/s, TB/s, SMs."""
    assert (GPUS["T4"].peak_tflops, GPUS["T4"].bandwidth_tb_s) == (65.0, 0.3)
    assert (GPUS["A100 SXM 80GB"].peak_tflops, GPUS["A100 SXM 80GB"].bandwidth_tb_s) == (312.0, 2.039)
    assert (GPUS["H100 SXM"].peak_tflops, GPUS["H100 SXM"].bandwidth_tb_s) == (989.5, 3.35)  # 1979 with sparsity
    assert (GPUS["H200 SXM"].peak_tflops, GPUS["H200 SXM"].bandwidth_tb_s) == (989.5, 4.8)
    assert (GPUS["A100 SXM 80GB"].num_sms, GPUS["H100 SXM"].num_sms) == (108, 132)
    assert all(g.source.startswith("https://") for g in GPUS.values())
    assert all("nvidia.com" in g.source for g in GPUS.values())


@pytest.mark.parametrize("name, expected", [
    ("T4", 65.0 / 0.3),             # 216.67 FLOP per byte
    ("A100 SXM 80GB", 312.0 / 2.039),  # 153.02
    ("H100 SXM", 989.5 / 3.35),     # 295.37
    ("H200 SXM", 989.5 / 4.8),      # 206.15
])
def test_balance_points(name, expected):
    assert_close(GPUS[name].balance_point, expected, dtype="float64", what=name)


def test_balance_points_rounded():
    assert [round(GPUS[n].balance_point) for n in ("T4", "A100 SXM 80GB", "H100 SXM", "H200 SXM")] == \
        [217, 153, 295, 206]


def test_the_issue_s_decode_step_in_fp16():
    """B = 1, H = 32, H_kv = 8, L = 1, D = 128, S = 16384, fp16."""
    c = decode_step_cost(1, 32, 8, 16384, 128)
    assert c.flops == 2 * 1 * 32 * 1 * 16384 * (128 + 128) == 268_435_456
    assert c.kv_bytes == 1 * 8 * 16384 * (128 + 128) * 2 == 67_108_864  # 64 MiB of cache
    assert c.q_bytes == 1 * 32 * 1 * 128 * 2 == 8192
    assert c.out_bytes == 8192
    assert c.bytes == 67_108_864 + 8192 + 8192
    assert_close(c.intensity, 268_435_456 / 67_125_248, dtype="float64")  # just under 4 = 2 G / 2 bytes
    memory_s, compute_s = c.seconds(GPUS["H100 SXM"])
    assert_close(memory_s, 67_125_248 / 3.35e12, dtype="float64")  # about 20 microseconds
    assert_close(compute_s, 268_435_456 / 989.5e12, dtype="float64")  # about 0.27 microseconds


def test_reading_the_cache_per_query_head_reads_it_group_times():
    grouped = decode_step_cost(1, 32, 8, 16384, 128, bytes_per_value=4)
    per_head = decode_step_cost(1, 32, 8, 16384, 128, bytes_per_value=4, kv_read_per="query_head")
    assert grouped.kv_bytes == 8 * 16384 * 256 * 4 == 134_217_728
    assert per_head.kv_bytes == 32 * 16384 * 256 * 4 == 536_870_912
    assert per_head.flops == grouped.flops == 2 * 32 * 16384 * 256


def test_chunked_step_batch_and_value_dim():
    c = decode_step_cost(3, 4, 2, 10, 8, q_len=5, head_dim_v=6, bytes_per_value=4)
    assert c.flops == 2 * 3 * 4 * 5 * 10 * (8 + 6) == 16800
    assert c.kv_bytes == 3 * 2 * 10 * (8 + 6) * 4 == 3360
    assert c.q_bytes == 3 * 4 * 5 * 8 * 4 == 1920
    assert c.out_bytes == 3 * 4 * 5 * 6 * 4 == 1440


def test_mha_decode_intensity_is_about_one_flop_per_byte():
    c = decode_step_cost(1, 1, 1, 1000, 64)
    assert c.flops == 2 * 1000 * 128 == 256_000
    assert c.bytes == 1000 * 128 * 2 + 64 * 2 + 64 * 2 == 256_256
    assert_close(c.intensity, 256_000 / 256_256, dtype="float64")


def test_prefill_by_hand():
    # N = 5, block_m = 2: query blocks end at keys 2, 4, 5 (causal) or read all 5 keys three times
    c = prefill_cost(1, 2, 1, 5, 4, bytes_per_value=2, block_m=2)
    assert c.flops == 2 * 2 * 15 * 8 == 480  # 5 * 6 / 2 = 15 visible pairs
    assert c.kv_bytes == 1 * (2 + 4 + 5) * 8 * 2 == 176
    assert c.q_bytes == c.out_bytes == 2 * 5 * 4 * 2 == 80
    full = prefill_cost(1, 2, 1, 5, 4, bytes_per_value=2, block_m=2, is_causal=False)
    assert full.flops == 2 * 2 * 25 * 8 == 800
    assert full.kv_bytes == 3 * 5 * 8 * 2 == 240


def test_prefill_is_compute_bound_on_an_h100():
    c = prefill_cost(1, 32, 8, 4096, 128)  # 32 query blocks of 128
    assert c.flops == 2 * 32 * (4096 * 4097 // 2) * 256 == 137_472_507_904
    keys = sum(128 * (m + 1) for m in range(32))  # 128 * 528 = 67584
    assert c.kv_bytes == 8 * keys * 256 * 2 == 276_824_064
    assert c.q_bytes == c.out_bytes == 32 * 4096 * 128 * 2 == 33_554_432
    assert c.intensity > GPUS["H100 SXM"].balance_point


def test_step_cost_adds_up():
    c = StepCost(flops=10, kv_bytes=3, q_bytes=1, out_bytes=1)
    assert (c.bytes, c.intensity) == (5, 2.0)
    assert c.seconds(GpuSpec("x", 2.0, 1.0, None, "https://example")) == (5 / 1e12, 10 / 2e12)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: decode_step_cost(1, 32, 6, 16, 8), ValueError, r"num_kv_heads must divide num_heads=32, got 6"),
    (lambda: decode_step_cost(1, 4, 2, 0, 8), ValueError, r"seqlen must be a positive int, got 0"),
    (lambda: decode_step_cost(1, 4, 2, 16.0, 8), TypeError, r"seqlen must be a positive int"),
    (lambda: decode_step_cost(1, 4, 2, 16, 8, q_len=0), ValueError, r"q_len must be a positive int"),
    (lambda: decode_step_cost(1, 4, 2, 16, 8, kv_read_per="group"), ValueError, r"kv_read_per must be one of"),
    (lambda: decode_step_cost(1, 4, 2, 16, 8, bytes_per_value=0), ValueError, r"bytes_per_value must be"),
    (lambda: prefill_cost(1, 4, 2, 16, 8, block_m=0), ValueError, r"block_m must be a positive int"),
    (lambda: prefill_cost(1, 4, 2, 16, 8, is_causal=1), TypeError, r"is_causal must be True or False"),
    (lambda: decode_step_cost(1, 4, 2, 16, 8).seconds("H100"), TypeError, r"gpu must be a GpuSpec, got str"),
])
def test_bad_input_gets_one_clear_error(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_module_exports():
    assert set(decode_cost.__all__) >= {"GPUS", "decode_step_cost", "prefill_cost", "GpuSpec", "StepCost"}
