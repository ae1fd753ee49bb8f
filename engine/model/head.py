"""An output layer over part of the vocabulary (FR-Spec): a draft proposing from its frequent
tokens pays for a fraction of the full head. Verification still uses the target's full
distribution, so output stays exact."""
from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.quant.int4 import GROUP_SIZES, Int4Linear, quantize_weight


def _head_rows(head: nn.Module, ids: torch.Tensor, hidden: int) -> torch.Tensor:
    """Rows ``ids`` of an output layer's weight ``[len(ids), H]``, whatever stores it:
    a plain weight is indexed; an int4 layer is run on the identity, in chunks."""
    if type(head) is nn.Linear:
        return head.weight.detach()[ids].float()
    device = next(itertools.chain(head.buffers(), head.parameters())).device
    bias = head(torch.zeros(1, hidden, device=device)).float()[0, ids]
    rows = []
    for start in range(0, hidden, 256):
        eye = torch.eye(hidden, device=device)[start : start + 256]
        rows.append(head(eye).float()[:, ids] - bias)  # [chunk, n] = W[ids, chunk].T
    return torch.cat(rows).T.contiguous()


def subset_head(model: nn.Module, ids: torch.Tensor,
                norm: tuple[torch.Tensor, float] | None = None) -> tuple[Callable[[torch.Tensor], torch.Tensor], bool]:
    """An output layer over the vocabulary rows ``ids`` only (FR-Spec): ``(f, folded)``, ``f(h [..., H])
    -> [..., V]`` logits, ``-inf`` outside ``ids``. On specchat's CPU kernel the head's own rows, with
    ``norm`` (the final norm's weight and eps) folded in as the full head folds it, so ``folded`` and
    each logit the full head's bits; elsewhere int4 when the model's head is int4, over ``h`` already
    normalised (``folded`` False)."""
    head = model.get_output_embeddings()
    hidden = int(model.config.get_text_config().hidden_size)
    width = int(model.config.get_text_config().vocab_size)
    small = head.rows(ids, norm) if isinstance(head, Int4Linear) else None
    folded = small is not None and norm is not None
    if small is None:  # a float head, or torch's int4 kernel: rebuilt from the rows' weights
        weight = _head_rows(head, ids, hidden)
        group = head.group_size if isinstance(head, Int4Linear) and head.group_size in GROUP_SIZES else GROUP_SIZES[0]
        if isinstance(head, Int4Linear) and len(ids) % 16 == 0 and hidden % group == 0:
            small = Int4Linear.fuse([Int4Linear(quantize_weight(weight, group), None, weight.device)])
        else:
            weight = weight.to(next(model.parameters()).dtype)
            small = lambda h: F.linear(h, weight)  # noqa: E731

    def f(h: torch.Tensor) -> torch.Tensor:
        out = h.new_full((*h.shape[:-1], width), float("-inf"))
        out[..., ids] = small(h).to(out.dtype)
        return out

    return f, folded
