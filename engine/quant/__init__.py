"""Quantization: the one place that knows how a model's weights are stored.

The loader asks two things of it:

* :func:`bnb_config` — the ``BitsAndBytesConfig`` for ``nf4`` / ``int8``
  (bitsandbytes, applied by ``from_pretrained``, for GPU users who choose it);
* :func:`apply_int4` — after a full-precision load, swap every linear layer for
  torch's own int4 kernels (:mod:`engine.quant.int4`), carrying a GGUF's
  blocks over code for code (:mod:`engine.quant.gguf_blocks`), and
  cache the groups so a warm start does not redo the work.

The package is a face: the kernels live in :mod:`engine.quant.int4` (torch's) and
:mod:`engine.quant.cpu_kernel` (specchat's), the int4 cache in :mod:`engine.quant.cache`,
bitsandbytes' settings in :mod:`engine.quant.bnb`; no module here imports the package back.
"""
from __future__ import annotations

from engine.quant.bnb import bnb_config
from engine.quant.cache import apply_int4, load_int4_streamed
from engine.quant.int4 import GROUP_SIZES, Int4Linear, Int4Weights, QuantReport, quantize_weight

__all__ = ["GROUP_SIZES", "Int4Linear", "Int4Weights", "QuantReport", "apply_int4", "bnb_config",
           "load_int4_streamed", "quantize_weight"]
