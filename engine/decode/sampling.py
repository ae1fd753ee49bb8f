"""Pure functions from logits to tokens: warping, greedy choice, sampling.

The same :func:`warp` is applied to the target's and the draft's logits, so
rejection sampling compares like with like and the emitted stream follows the
target's *warped* distribution (temperature, top-k, top-p) exactly.

A reply's randomness (:data:`Randomness`) is explicit and comes in two kinds:

* unseeded: a ``torch.Generator`` stream, consumed by rejection sampling
  (:func:`engine.decode.verify.verify_sampled`); how much of it a round uses depends
  on K, so the reply depends on the schedule;
* seeded: :class:`GumbelNoise`, one noise row per reply position drawn from
  (seed, position) alone; a token is the Gumbel-argmax of the warped scores
  (:func:`gumbel_argmax`), so the reply does not depend on K or the drafter
  (:func:`engine.decode.verify.verify_coupled`).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch

from engine.model.device import Device, to_device
from engine.errors import NonFiniteLogitsError
from engine.events import SamplingParams

Role = str  # "target" or "draft": which model's logits, for the error message


def make_generator(params: SamplingParams, device: Device) -> torch.Generator | None:
    """A generator seeded from ``params.seed`` (fresh entropy when None); None when greedy."""
    if params.greedy:
        return None
    gen = torch.Generator(device=device.torch_device)
    if params.seed is None:
        gen.seed()
    else:
        gen.manual_seed(params.seed)
    return gen


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits into the probabilities tokens are sampled from.

    Args:
        logits: ``[..., V]`` raw logits.
        params: temperature (> 0 here), top-k (0 = off), top-p (1 = off).

    Returns:
        ``[..., V]`` float32 probabilities, zero outside the top-k / top-p set
        (the most likely token is always kept).
    """
    return torch.softmax(warp_scores(logits, params), dim=-1)


def warp_scores(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The warped log-probabilities up to a constant per row.

    Args:
        logits: ``[..., V]`` raw logits.
        params: temperature (> 0 here), top-k (0 = off), top-p (1 = off).

    Returns:
        ``[..., V]`` float32 ``logits / T``, ``-inf`` outside the top-k / top-p
        set; ``softmax`` of it is :func:`warp`.
    """
    if params.greedy:
        raise ValueError("warp is for sampling; greedy decoding uses argmax")
    scores = logits.float() / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token when the tokens ranked above it already cover top_p.
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from ``probs`` (``[V]``, summing to 1)."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def sample_on_device(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id drawn from ``probs`` (``[V]``) as a 0-d long tensor on its device, with no
    host transfer. Probabilities that are not a distribution (NaN from a model whose logits
    overflowed) are swapped for a uniform one on the device first: ``multinomial`` would
    otherwise stop the whole CUDA context with a device-side assert. The caller checks the
    logits' finiteness with its one transfer (:func:`to_host`) and raises there."""
    usable = torch.isfinite(probs).all() & (probs.sum() > 0)
    safe = torch.where(usable, probs, torch.ones_like(probs))
    return torch.multinomial(safe, 1, generator=generator)[0]


def finite(logits: torch.Tensor) -> torch.Tensor:
    """0-d bool tensor, on ``logits``' device: every row ``[..., V]`` has a finite maximum and
    no NaN (``amax`` carries a NaN through). ``-inf`` entries are allowed (a frequent-token
    head masks the rest of the vocabulary); one reduction, no host transfer."""
    return torch.isfinite(logits.amax(dim=-1)).all()


def non_finite_error(role: Role) -> NonFiniteLogitsError:
    """The error for NaN or inf logits, saying what to change."""
    return NonFiniteLogitsError(
        f"the {role} model's logits are NaN or inf: its activations overflowed, as Qwen2.5's do in float16 "
        f"(the dtype cards below compute capability 8.0 get). Set dtype = \"float32\" on the {role} in your "
        f"models.toml (or dtype = \"bfloat16\" on a card of compute capability 8.0 or newer), or pick another "
        "profile (docs/gpu.md, step 0). Where the model ran well before, or runs in float32 already, its files "
        "in the cache may be damaged: `specchat models remove` it, and its next start fetches and converts it "
        "again", role)


def to_host(choices: torch.Tensor, ok: torch.Tensor, role: Role = "target") -> list[int]:
    """Token ids ``[n]`` (a device tensor) as a list, and the finiteness flag ``ok`` (0-d bool from
    :func:`finite`) checked, in one device-to-host transfer. Raises
    :class:`~engine.errors.NonFiniteLogitsError` when ``ok`` is false."""
    host = torch.cat([choices.reshape(-1).long(), ok.reshape(1).long()]).tolist()
    if not host[-1]:
        raise non_finite_error(role)
    return [int(x) for x in host[:-1]]


def check_finite(logits: torch.Tensor, role: Role = "target") -> None:
    """Raise :class:`~engine.errors.NonFiniteLogitsError` unless ``logits`` ``[..., V]`` are
    finite (one transfer: for the sampled path, before anything is drawn from them)."""
    if not bool(finite(logits)):
        raise non_finite_error(role)


def uniform(generator: torch.Generator | None, device: Device) -> float:
    """One draw from U[0, 1) on ``device`` with ``generator``."""
    return float(torch.rand((), generator=generator, device=device.torch_device).item())


class GumbelNoise:
    """Gumbel noise keyed by reply position, for seeded (coupled) sampling.

    Row ``i`` is ``g_i(v) = -log(-log(U_i(v)))`` for ``v < width``, with
    ``U_i ~ U[0, 1)`` drawn by a CPU ``torch.Generator`` seeded with a hash of
    ``(seed, i)`` alone, where ``i`` is the token's index within the reply
    (0 for its first token). ``argmax_v(log p(v) + g_i(v))`` is then a draw from
    ``p`` (the Gumbel-max trick), and every sampler that uses row ``i`` for
    reply position ``i`` (plain decoding, the target verifying a draft, the
    draft model proposing) makes the same choice from the same scores.

    Keyed by reply position rather than sequence index: the same seed gives the
    same noise to every reply, as reseeding a generator per reply would.

    Reproducible: the uniforms are a function of (seed, i, width) and the
    torch version only: drawn on the CPU by the Mersenne Twister, serially (so
    not the thread count either), and turned into Gumbel noise on the CPU, then
    moved to ``device``: CUDA and CPU runs get the same noise. The float32
    ``log`` is torch's vectorised one, which may differ in the last bit between
    CPU instruction sets. So a seeded reply is the same token for token on one
    machine and software stack whatever the drafter, K or load; across
    machines, dtypes or devices the target's logits themselves differ in the
    last bits, and a token whose two best noised scores are that close may
    differ (greedy decoding has the same limit). The same holds within one run
    between a one-token and a multi-token target pass, whose logits may differ
    by rounding: a flip needs two noised scores within that rounding.

    Cost: one row per reply position, ``width`` uniforms and two logs on the
    CPU (a fraction of a millisecond for 50k-150k tokens), kept for ``keep``
    positions so a rejected draft's positions are not drawn twice.

    Args:
        seed: the reply's seed.
        start: sequence index of the reply's first token (the prompt length).
        width: ``V``, the target's logits width.
        device: where rows are returned.
        keep: rows kept in memory (positions are asked for again when a draft
            is rejected, never long after).
    """

    def __init__(self, seed: int, start: int, width: int, device: Device, keep: int = 64) -> None:
        self.seed = seed
        self.start = start
        self.width = width
        self.device = device
        self._keep = keep
        self._rows: OrderedDict[int, torch.Tensor] = OrderedDict()

    def row(self, index: int) -> torch.Tensor:
        """``[width]`` float32 noise for the token at sequence index ``index``."""
        position = index - self.start
        if position < 0:
            raise ValueError(f"sequence index {index} is inside the prompt (the reply starts at {self.start})")
        cached = self._rows.get(position)
        if cached is None:
            cached = to_device(gumbel_row(self.seed, position, self.width), self.device.torch_device)
            self._rows[position] = cached
            while len(self._rows) > self._keep:
                self._rows.popitem(last=False)
        return cached

    def rows(self, first: int, n: int) -> torch.Tensor:
        """``[n, width]`` noise for the tokens at sequence indices ``first .. first + n - 1``."""
        return torch.stack([self.row(first + j) for j in range(n)])


def gumbel_row(seed: int, position: int, width: int) -> torch.Tensor:
    """``[width]`` float32 standard Gumbel noise on the CPU, a function of its arguments alone."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    gen = torch.Generator(device="cpu").manual_seed(int.from_bytes(digest, "little") >> 1)
    # 53-bit uniforms keep the upper tail (u near 0) exact; float32 logs are
    # several times cheaper than float64 ones. log1p keeps -log(u) accurate for
    # u near 1 (there a cast that rounds u to 1 gives -inf: never chosen).
    u = torch.rand(width, generator=gen, dtype=torch.float64).float().clamp_(min=torch.finfo(torch.float32).tiny)
    return -torch.log(-torch.log1p(-u))


def gumbel_argmax(logits: torch.Tensor, params: SamplingParams, noise: torch.Tensor) -> torch.Tensor:
    """The token chosen by the Gumbel-max trick: ``argmax(warp_scores + noise)``.

    ``warp_scores`` differs from the warped log-probabilities by a constant per
    row, which does not move the argmax.

    Args:
        logits: ``[..., V]`` raw logits (a draft's ``V`` may differ from the target's).
        params: the warping (temperature > 0, top-k, top-p).
        noise: ``[..., V']`` Gumbel rows; cut to ``V``, or padded with zeros
            (the padded ids are masked to ``-inf`` by the caller anyway).

    Returns:
        ``[...]`` long token ids.
    """
    scores = warp_scores(logits, params)
    vocab, width = scores.shape[-1], noise.shape[-1]
    if width > vocab:
        noise = noise[..., :vocab]
    elif width < vocab:
        noise = torch.nn.functional.pad(noise, (0, vocab - width))
    return torch.argmax(scores + noise.to(scores.device), dim=-1)


Randomness = torch.Generator | GumbelNoise | None
"""A reply's randomness: None when greedy, :class:`GumbelNoise` when seeded,
else a ``torch.Generator`` stream for rejection sampling."""


def make_randomness(params: SamplingParams, start: int, width: int, device: Device) -> Randomness:
    """The randomness for one reply (see the module docstring).

    Args:
        params: the reply's sampling settings.
        start: sequence index of the reply's first token (the prompt length).
        width: the target's logits width ``V``.
    """
    if params.greedy:
        return None
    if params.seed is not None:
        return GumbelNoise(params.seed, start, width, device)
    return make_generator(params, device)
