"""bitsandbytes settings for ``nf4`` / ``int8`` (applied by ``from_pretrained``, for GPU users who choose it)."""
from __future__ import annotations

from typing import Any

import torch


def bnb_config(quantization: str, compute_dtype: torch.dtype) -> Any | None:
    """bitsandbytes settings: nf4 with double quant in ``compute_dtype``, or int8; None otherwise."""
    if quantization not in ("nf4", "int8"):
        return None
    from transformers import BitsAndBytesConfig

    if quantization == "nf4":
        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
        )
    return BitsAndBytesConfig(load_in_8bit=True)
