"""Alias kept so the FlashAttention test files keep their import line: the shared inputs and
references live in tests/attn_paths.py (the one module of shared test inputs)."""
from attn_paths import flash_inputs as make_inputs, flash_reference as reference

__all__ = ["make_inputs", "reference"]
