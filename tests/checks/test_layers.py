"""attn_lib.checks.layers: the doors of the layers' forwards.

Each refusal is compared with its whole message. The kernel backend's door runs with the package's presence
and the process's interpreter mode given (nothing is compiled here).
"""
import pytest
import torch

import attn_lib.checks.flash as flash_checks
from attn_lib import MultiHeadAttention, SelfAttention
from attn_lib.checks.layers import check_layer_call, check_self_attention_call


def _x(C=8, dtype=torch.float32):
    return torch.randn(2, 3, C, generator=torch.Generator().manual_seed(0), dtype=dtype)  # (B,L,C)


def test_autocast_does_not_let_a_float64_layer_take_16_bit_inputs():
    """Autocast leaves float64 projections alone, so a bfloat16 input is refused by a float64 layer under it
    (a float32 layer takes it: its projections then produce bfloat16)."""
    x = _x(dtype=torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert MultiHeadAttention(8, 2)(x).dtype == torch.bfloat16
        with pytest.raises(TypeError) as info:
            MultiHeadAttention(8, 2).double()(x)
    assert str(info.value) == ("query has dtype torch.bfloat16 but the layer's parameters are torch.float64; convert "
                               "one of them, e.g. layer.to(torch.bfloat16) or query.to(torch.float64)")


@pytest.fixture
def kernels_present(monkeypatch):
    """The kernel package counts as installed (only its presence is asked)."""
    monkeypatch.setattr(flash_checks, "triton_available", lambda: True)


def _interpreter():
    """The process runs the kernels under the interpreter: CPU tensors are accepted."""
    return True


def _compiled():
    """The process compiles GPU kernels: only CUDA tensors are accepted."""
    return False


DEVICE_REFUSED = "backend='triton' got tensors on cpu, but Triton in this process compiles GPU kernels"


def test_a_kernel_multi_head_layer_asks_the_process_where_its_kernels_run(kernels_present):
    layer, x = MultiHeadAttention(8, 2, backend="triton"), _x()
    key, value, settings = check_layer_call(layer, x, None, None, None, False, None, _interpreter)
    assert key is x and value is x and settings.backend == "triton"
    with pytest.raises(ValueError) as info:
        check_layer_call(layer, x, None, None, None, False, None, _compiled)
    assert str(info.value).startswith(DEVICE_REFUSED)


def test_a_kernel_self_attention_layer_asks_the_process_where_its_kernels_run(kernels_present):
    layer, x = SelfAttention(8, backend="triton"), _x()
    assert check_self_attention_call(layer, x, None, False, _interpreter).backend == "triton"
    with pytest.raises(ValueError) as info:
        check_self_attention_call(layer, x, None, False, _compiled)
    assert str(info.value).startswith(DEVICE_REFUSED)
