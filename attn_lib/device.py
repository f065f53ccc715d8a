"""第 08、09、11 章（设备）：设备选择只在这一处（第 08、09 章的 Triton 核函数也在这里决定怎么运行）：有 GPU 用 GPU，没有就用 CPU；导入本模块不会触碰 CUDA。

Set ``ATTN_LIB_DEVICE=cpu`` (or ``cuda``, ``cuda:1``) to override the choice everywhere.

Triton's mode is a property of the process: whether ``@triton.jit`` builds GPU kernels or
interpreted Python is fixed when a kernel module (Triton's own library included) is first
imported, from the environment variable ``TRITON_INTERPRET``. ``triton_interprets()`` decides
it once, before attn_lib imports Triton, and keeps the answer:

- Triton not imported yet: interpret if ``TRITON_INTERPRET=1`` is set or there is no CUDA
  device (then it sets ``TRITON_INTERPRET=1`` for the rest of the process), else compile.
- Importing attn_lib already sets ``TRITON_INTERPRET=1`` when it can tell without touching
  CUDA that the process has no CUDA device (a CPU-only torch build; on Linux, no
  ``/dev/nvidia*`` device file), because torch itself may import Triton before attn_lib's
  first kernel call (``TorchDispatchMode``, ``torch.compile``). It never imports Triton.
- Triton already imported (by torch.compile, by the reader's own code): its mode stands.
  Compiled mode on a machine without a CUDA device cannot run anything, so that is a clear
  error naming the remedy (set ``TRITON_INTERPRET=1`` first, or call
  ``use_triton_interpreter()`` before anything imports Triton, or use ``backend='torch'``).
"""
from __future__ import annotations

import glob
import os
import sys

from .checks import check_int
from .rules.names import DEVICE_ENV, TRITON_ENV

ENV_VAR = DEVICE_ENV
_TRUE = ("1", "true", "on", "yes")  # the values Triton's env_bool reads as true
_triton_mode: dict = {}  # {"interpret": bool} once decided


def cuda_available() -> bool:
    """本机是否有可用的 CUDA GPU（只查询，不初始化 CUDA 上下文）。"""
    import torch

    return bool(torch.cuda.is_available())


def try_gpu(index: int = 0):
    """有第 ``index`` 块 GPU 就返回它，否则返回 CPU；环境变量 ATTN_LIB_DEVICE 优先。

    Args:
        index: which CUDA device to prefer.

    Returns:
        ``torch.device``.
    """
    import torch

    check_int("index", index, 0)
    forced = os.environ.get(ENV_VAR)
    if forced:
        try:
            return torch.device(forced)
        except RuntimeError:
            raise ValueError(
                f"{ENV_VAR}={forced!r} is not a torch device; use e.g. 'cpu', 'cuda' or 'cuda:1', or unset it"
            ) from None
    if cuda_available() and index < torch.cuda.device_count():
        return torch.device(f"cuda:{index}")
    return torch.device("cpu")


def default_device():
    """全书默认设备：等同于 ``try_gpu()``。"""
    return try_gpu()


def imported_triton_interprets() -> bool | None:
    """已导入的 Triton 是否处于解释器模式；还没导入时返回 None（本函数不导入 Triton）。"""
    if "triton" not in sys.modules:
        return None
    std = sys.modules.get("triton.language.standard")
    if std is None:  # triton imported without its language package (unusual): import it now
        import triton.language.standard as std  # noqa: PLC0415
    return type(std.zeros).__name__ == "InterpretedFunction"


def _env_interprets() -> bool:
    return os.environ.get(TRITON_ENV, "0").strip().lower() in _TRUE


def use_triton_interpreter() -> None:
    """在任何代码导入 Triton 之前调用：让本进程的 Triton 用解释器（CPU 上运行核函数）。

    Sets ``TRITON_INTERPRET=1``. Raises RuntimeError if Triton was already imported in
    compiled mode (the choice cannot change inside a process) or attn_lib already decided
    to compile.
    """
    if _triton_mode.get("interpret") is False or imported_triton_interprets() is False:
        raise RuntimeError(
            "use_triton_interpreter() came too late: Triton is already imported in compiled mode in this "
            "process (expected: not imported yet). Call it before anything imports triton or torch._dynamo, "
            f"or start Python with {TRITON_ENV}=1."
        )
    os.environ[TRITON_ENV] = "1"
    _triton_mode["interpret"] = True


def triton_interprets() -> bool:
    """本进程的 Triton 是否用解释器运行（每个进程只决定一次；不导入 Triton）。

    Returns:
        True: kernels run under Triton's interpreter (on CPU tensors); False: compiled GPU
        kernels (on CUDA tensors).

    Raises:
        RuntimeError: Triton was imported in compiled mode but this machine has no CUDA device.
    """
    if "interpret" in _triton_mode:
        return _triton_mode["interpret"]
    imported = imported_triton_interprets()
    if imported is None:  # Triton not imported yet: attn_lib chooses, before importing it
        interpret = _env_interprets() or not cuda_available()
        if interpret:
            os.environ[TRITON_ENV] = "1"
    elif imported or cuda_available():
        interpret = imported
    else:
        raise RuntimeError(
            "Triton is already imported in compiled (GPU) mode, but this machine has no CUDA device "
            "(torch.cuda.is_available() is False), so its kernels cannot run here; expected Triton "
            f"in interpreter mode. Remedy: set {TRITON_ENV}=1 before anything imports triton (start Python "
            f"with {TRITON_ENV}=1, or call attn_lib.device.use_triton_interpreter() first, before e.g. "
            "torch.compile / torch._dynamo), or use backend='torch'."
        )
    _triton_mode["interpret"] = interpret
    return interpret


def no_cuda_device_for_sure() -> bool:
    """不触碰 CUDA 就能断定本进程没有 CUDA GPU 吗（CPU 版 torch；Linux 上没有 /dev/nvidia* 设备文件）。"""
    import torch

    if torch.version.hip is not None:  # ROCm: leave the choice to triton_interprets()
        return False
    if torch.version.cuda is None:  # a CPU-only build of torch
        return True
    return sys.platform.startswith("linux") and not glob.glob("/dev/nvidia[0-9]*")


def prefer_interpreter_early() -> None:
    """导入 attn_lib 时调用：确定没有 GPU 且 Triton 还没被导入时，先设好 TRITON_INTERPRET=1。

    Does nothing when ``TRITON_INTERPRET`` is already set, when Triton is already imported, or
    when a CUDA device may exist (then ``triton_interprets()`` decides at the first kernel call).
    """
    if TRITON_ENV in os.environ or "triton" in sys.modules or _triton_mode:
        return
    if no_cuda_device_for_sure():
        os.environ[TRITON_ENV] = "1"


def cuda_capability(device) -> tuple:
    """GPU 的计算能力 (major, minor)，例如 T4 是 (7, 5)、A100 是 (8, 0)。"""
    import torch

    return tuple(torch.cuda.get_device_capability(device))


prefer_interpreter_early()
