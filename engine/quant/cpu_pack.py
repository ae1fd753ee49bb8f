"""How weights lie in memory for specchat's CPU kernel (:mod:`engine.quant.cpu_kernel`): the codes and
scale tables each kind of weight is packed into (:func:`pack`: int4 with bf16 scales, a GGUF's Q4_K rows
with their own headers; :func:`pack8`: 8-bit; :func:`pack6`: a GGUF's Q6_K as 6-bit codes), the VNNI
variants' order, the layout the int4 cache records (:func:`layout_tag`) and huge pages for the weights
the kernel streams. The arithmetic that reads them is described in :mod:`engine.quant.cpu_kernel`.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass

import torch

from engine.quant.cpu_isa import vnni_order
from engine.quant.cpu_kernel import is_vnni, variant as kernel_variant

GROUP = 32  # the kernel's group size
K_MULTIPLE = 64  # inputs per row must fill whole pairs of groups (32 bytes of codes)

HUGE_PAGE = 2 << 20
HUGE_MIN_BYTES = 4 << 20
"""Weights at least this large go on huge pages (:func:`on_huge_pages`); smaller ones would
gain little against what the alignment wastes."""


def on_huge_pages(t: torch.Tensor, copy: bool = False) -> torch.Tensor:
    """``t`` copied into memory the kernel streams from 2 MiB pages, where Linux allows it
    (``copy``: a plain copy where it does not, never ``t`` itself).

    A decode step reads every weight once, front to back: on 4 KiB pages the CPU's prefetchers
    stop at each page boundary and the TLB misses once a page. With transparent huge pages in
    ``madvise`` mode (the common default) torch's allocations stay on small pages, so weights of
    at least :data:`HUGE_MIN_BYTES` get an anonymous mapping advised ``MADV_HUGEPAGE`` (its whole
    2 MiB-aligned interior; the tail stays on small pages). About 6-9% off a large matmul here.
    Elsewhere (no ``MADV_HUGEPAGE``, a CUDA tensor) ``t`` comes back as it is.
    """
    n = t.numel() * t.element_size()
    if n < HUGE_MIN_BYTES or t.device.type != "cpu" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return t.clone() if copy else t
    try:
        region = mmap.mmap(-1, n + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        raw = torch.frombuffer(region, dtype=torch.uint8)  # the tensor keeps the mapping alive
        offset = -raw.data_ptr() % HUGE_PAGE
        region.madvise(mmap.MADV_HUGEPAGE, offset, n - n % HUGE_PAGE)
    except (OSError, ValueError):
        return t.clone() if copy else t
    out = raw[offset : offset + n].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


LAYOUT_VERSION = 2  # of pack's output; the int4 cache keeps weights in it (a change rebuilds those caches).
# 2: a GGUF's Q4_K and Q6_K rows keep their super-blocks' own scales (4.5 and 6.56 bits a weight, not 5 and 7)

TILE_ROWS = 4
"""Rows a tile of Q4_K rows holds (:func:`tile_rows`; ``TILE`` in csrc/int4_avx2.c)."""
TILE_MAX_K = 2048
"""Q4_K rows of more inputs stay apart: in tiles they ran no faster or slower (3584 and 8960 inputs, docs/performance.md)."""
TILED_VARIANTS = frozenset({"avx512-vnni"})
"""The kernel variants whose Q4_K rows :func:`pack` lays out in tiles: measured faster on AVX-512 (Zen 4,
docs/performance.md); the AVX2 machines that set the other variants' layout were not measured with them."""


def layout_tag(name: str | None = None) -> str:
    """The layout :func:`pack` makes for variant ``name`` (else this process's), as the int4 cache records
    it: :data:`LAYOUT_VERSION`, ``-vnni`` for the VNNI variants' order and ``-t4`` where Q4_K rows come in
    tiles of four (a cache of one layout is not read by a process of another)."""
    return f"{LAYOUT_VERSION}{'-vnni' if is_vnni(name) else ''}{f'-t{TILE_ROWS}' if tiles(name) else ''}"


def tiles(name: str | None = None) -> bool:
    """Whether :func:`pack` lays out Q4_K rows in tiles for variant ``name`` (else this process's)."""
    return (name or kernel_variant()) in TILED_VARIANTS


def in_tiles(n: int, k: int, name: str | None = None) -> bool:
    """Whether :func:`pack` lays out ``n`` Q4_K rows of ``k`` inputs in tiles for variant ``name`` (else this
    process's): whole tiles of rows of at most :data:`TILE_MAX_K` inputs, for the :data:`TILED_VARIANTS`."""
    return tiles(name) and n % TILE_ROWS == 0 and k <= TILE_MAX_K


def tile_rows(packed: torch.Tensor, headers: torch.Tensor) -> torch.Tensor:
    """Q4_K rows in tiles of :data:`TILE_ROWS` (T): ``packed`` uint8 ``[N, K/2]`` (:func:`pack`'s codes) and their
    ``headers`` ``[N, K/256·16]`` as uint8 ``[N/T, K/256, T, 144]``: per tile and super-block the T rows' headers
    (16 bytes each), then their codes (128 each), so that the kernel streams a tile's rows as one run of bytes,
    and no 32-byte load of codes straddles two cache lines. ``N % T == 0``."""
    n, half = packed.shape
    blocks, t = half // 128, n // TILE_ROWS
    heads = headers.reshape(t, TILE_ROWS, blocks, 16).transpose(1, 2).reshape(t, blocks, TILE_ROWS * 16)
    codes = packed.reshape(t, TILE_ROWS, blocks, 128).transpose(1, 2).reshape(t, blocks, TILE_ROWS * 128)
    return torch.cat([heads, codes], dim=2).reshape(t, blocks, TILE_ROWS, 144).contiguous()


def untile(tiled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tile_rows` undone: ``(packed [N, K/2], headers [N, K/256·16])``, as :func:`pack` lays rows out."""
    t, blocks = tiled.shape[:2]
    flat = tiled.reshape(t, blocks, TILE_ROWS * 144)
    heads = flat[:, :, : TILE_ROWS * 16].reshape(t, blocks, TILE_ROWS, 16).transpose(1, 2)
    codes = flat[:, :, TILE_ROWS * 16 :].reshape(t, blocks, TILE_ROWS, 128).transpose(1, 2)
    return codes.reshape(t * TILE_ROWS, blocks * 128).contiguous(), heads.reshape(t * TILE_ROWS, blocks * 16).contiguous()


@dataclass(frozen=True)
class KernelLayout:
    """A weight as this kernel reads it, :func:`pack`'s output: the int4 cache keeps it so a warm start
    hands it to :class:`engine.quant.int4.Int4Linear` and packs nothing (seconds on a 1.5B model).

    ``packed`` and ``table`` as :func:`pack` returns them; ``shape`` the weight's ``(N, K)``;
    ``group_size`` and ``planes`` those of the groups it was packed from.
    """

    packed: torch.Tensor
    table: torch.Tensor
    shape: tuple[int, int]
    group_size: int
    planes: int


SIX_BIT_GROUP = 16
"""The group size of 6-bit weights (a GGUF's Q6_K sub-blocks), carried as two planes."""
SIX_BIT_K_MULTIPLE = 256


def fits(k: int, group_size: int) -> bool:
    """Whether a weight with ``k`` inputs (per plane) in groups of ``group_size`` suits the kernel."""
    if group_size == SIX_BIT_GROUP:
        return k % SIX_BIT_K_MULTIPLE == 0
    return group_size == GROUP and k % K_MULTIPLE == 0


def pack(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, planes: int,
         six: tuple[torch.Tensor, torch.Tensor] | None = None, variant: str | None = None,
         headers: torch.Tensor | None = None, tiled: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's layout of int4 groups (those of :class:`engine.quant.int4.Int4Weights`).

    Args:
        codes: uint8 ``[N, planes·K]`` in 0..15, ``w = (q − 8)·scale + zero``.
        scale, zero: ``[N, planes·K/32]``.
        headers: from a GGUF's Q4_K (one plane) or Q6_K (6-bit planes), its super-blocks' own scales
            (:attr:`engine.quant.groups.Int4Weights.headers`), which must give ``scale`` and ``zero``
            (:func:`check_headers`).
    Returns:
        One plane: ``(packed, scales)``: uint8 ``[N, K/2]``, where each 64 weights take 32
        bytes, byte ``j`` holding weight ``j`` in its low nibble and ``j + 32`` in its high one;
        and bf16 ``[N, 1, 2, K/32]``, the scales then the zeros (rounded to bf16 as torch's
        kernel rounds them), or with ``headers`` those headers as they are (the kernel computes
        ``d·sc`` and ``−dmin·m`` from them exactly: 16 bytes a 256 weights, not 32). Two planes (8-bit weights, :func:`engine.quant.int4.two_planes`)
        are joined back into one byte a weight (:func:`pack8`), or, in groups of 16, laid out as 6-bit
        codes (:func:`pack6`; ``six``: their :func:`six_bit_codes`, when the caller has them).
        ``variant``: the kernel variant they are for (else this process's): the VNNI ones take the
        codes in :func:`vnni_order`. Q4_K rows with ``headers`` come in tiles (:func:`tile_rows`, with an
        empty table ``[N, 0]``) when ``N`` makes whole tiles and ``tiled`` says so, by default as
        :func:`in_tiles` says.
    """
    if planes == 2:
        if scale.shape[1] * SIX_BIT_GROUP == codes.shape[1]:
            return pack6(codes, scale, zero, six, variant=variant, headers=headers)
        return pack8(codes, scale, zero, variant=variant)
    n, width = codes.shape
    if headers is not None:
        check_headers(headers, scale, zero)
    if is_vnni(variant):
        codes = vnni_order(codes)
    pairs = codes.to(torch.uint8).reshape(n, width // 64, 2, 32)
    packed = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(n, width // 2).contiguous()
    if headers is not None:
        if in_tiles(n, width, variant) if tiled is None else tiled and n % TILE_ROWS == 0:
            return tile_rows(packed, headers.to(torch.uint8)), torch.empty(n, 0, dtype=torch.uint8)
        return packed, headers.to(torch.uint8).contiguous()
    return packed, bf16_table(scale, zero, planes)


def bf16_table(scale: torch.Tensor, zero: torch.Tensor, planes: int = 1) -> torch.Tensor:
    """The int4 kernel's bf16 table ``[N, planes, 2, G]`` of groups' scales and zeros (``[N, planes·G]``
    each), rounded to bf16 as torch's kernel rounds them."""
    n = scale.shape[0]
    table = torch.stack([scale.reshape(n, planes, -1), zero.reshape(n, planes, -1)], dim=2)
    return table.to(torch.bfloat16).contiguous()


Q4_K_HEADER = 16
"""Bytes of a Q4_K super-block's header: fp16 ``d`` and ``dmin``, 12 bytes of 6-bit sub-scales and mins."""


def header_scales(headers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K headers uint8 ``[N, B·16]`` as fp32 ``(d·sc, dmin·m)``, each ``[N, 8B]`` and exact (how the
    kernel reads them, ``csrc/int4_avx2.c``'s ``kq_scales``; a GGUF's own unpacking of the 12 bytes)."""
    n = headers.shape[0]
    h = headers.reshape(n, -1, Q4_K_HEADER).to(torch.int32)
    d = h[..., 0:2].to(torch.uint8).contiguous().view(torch.float16).float()
    dmin = h[..., 2:4].to(torch.uint8).contiguous().view(torch.float16).float()
    q = h[..., 4:16]
    sc = torch.cat([q[..., 0:4] & 63, (q[..., 8:12] & 15) | (q[..., 0:4] >> 6) << 4], dim=-1)
    mn = torch.cat([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | (q[..., 4:8] >> 6) << 4], dim=-1)
    return (d * sc.float()).reshape(n, -1), (dmin * mn.float()).reshape(n, -1)


Q6_K_HEADER = 18
"""Bytes of a Q6_K super-block's scales: 16 int8 sub-scales, then fp16 ``d``."""


def six_header_scales(headers: torch.Tensor) -> torch.Tensor:
    """Q6_K headers uint8 ``[N, B·18]`` as fp32 ``d·sc`` ``[N, 16B]``, exact (how the kernel reads them)."""
    n = headers.shape[0]
    h = headers.reshape(n, -1, Q6_K_HEADER)
    sc = h[..., :16].contiguous().view(torch.int8).float()
    d = h[..., 16:18].contiguous().view(torch.float16).float()
    return (d * sc).reshape(n, -1)


def check_headers(headers: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, planes: int = 1) -> None:
    """That a Q4_K's headers give these groups (``scale == d·sc`` exactly and ``zero − 8·scale == −dmin·m`` up
    to the fp32 rounding of ``zero``), or with ``planes = 2`` a Q6_K's give its 6-bit planes' scales (the low
    plane's, ``d·sc`` exactly); ValueError where they do not (the headers belong to other weights)."""
    n = scale.shape[0]
    if planes == 2:
        low = scale[:, : scale.shape[1] // 2]
        if headers.shape != (n, low.shape[1] // 16 * Q6_K_HEADER) or low.shape[1] % 16:
            raise ValueError(f"Q6_K headers of shape {tuple(headers.shape)} do not fit {n} x {low.shape[1] * 16} weights")
        if not torch.equal(six_header_scales(headers), low.float()):
            raise ValueError("the Q6_K headers do not give these weights' scales")
        return
    if headers.shape != (n, scale.shape[1] * 2) or scale.shape[1] % 8:
        raise ValueError(f"Q4_K headers of shape {tuple(headers.shape)} do not fit {n} x {scale.shape[1] * 32} weights")
    s, m = header_scales(headers)
    offset = zero.float() - 8.0 * scale.float()
    tol = 1e-6 * float(zero.float().abs().max().clamp(min=1e-30))
    if not torch.equal(s, scale.float()) or float((offset + m).abs().max()) > tol:
        raise ValueError("the Q4_K headers do not give these weights' scales and zeros")


def pack8(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
          variant: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Two int4 planes (low ``l``, high ``h``, the high plane's scale 16 times the low one's) as
    8-bit weights, the layout of ``specchat_int8_mm``: int8 codes ``v = 16 h + l − 128``
    ``[N, K]`` and fp32 ``[N, 2, K/32]``: the scale ``s`` (the low plane's, rounded to bf16 as
    the planes' are) then the offset ``c = z_lo + z_hi − 8 s`` (bf16 zeros), so that
    ``w = v·s + c`` is the planes' ``(l − 8)·s + z_lo + (h − 8)·16 s + z_hi``. Half the
    kernel's work of two planes, the same bytes.
    """
    n, width = codes.shape
    k = width // 2
    s_lo, s_hi = (t.to(torch.bfloat16).float() for t in scale.reshape(n, 2, -1).unbind(1))
    if not torch.equal(s_hi, 16.0 * s_lo):
        raise ValueError("the high plane's scales are not 16 times the low plane's")
    z_lo, z_hi = (t.to(torch.bfloat16).float() for t in zero.reshape(n, 2, -1).unbind(1))
    u = codes[:, :k].to(torch.uint8) | (codes[:, k:].to(torch.uint8) << 4)  # 16 h + l, in place of wider ints
    u ^= 0x80  # u - 128, as the int8 the bits then read as (no [N, K] int16 copy of a 150k-row head)
    if is_vnni(variant):
        u = vnni_order(u)
    table = torch.stack([s_lo, z_lo + z_hi - 8.0 * s_lo], dim=1)
    return u.view(torch.int8).contiguous(), table.contiguous()


def six_bit_codes(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Two int4 planes in groups of 16 as 6-bit codes ``q`` uint8 ``[N, K]`` in 0..63 and bf16 scales
    ``s`` ``[N, K/16]`` with ``w = (q − 32)·s`` (a Q6_K's codes and sub-scales as
    :func:`engine.quant.gguf_blocks.decode_q6_k_rows` carries them: ``u = q + 96``, zeros ``8 s`` and 0);
    None when the planes are not of that form."""
    n, width = codes.shape
    k = width // 2
    s_lo, s_hi = (t.to(torch.bfloat16) for t in scale.reshape(n, 2, -1).unbind(1))
    z_lo, z_hi = (t.to(torch.bfloat16) for t in zero.reshape(n, 2, -1).unbind(1))
    if not (torch.equal(s_hi.float(), 16.0 * s_lo.float()) and torch.equal(z_lo.float(), 8.0 * s_lo.float())
            and not bool(z_hi.any())):
        return None
    u = codes[:, :k].to(torch.uint8) | (codes[:, k:].to(torch.uint8) << 4)
    low, high = torch.aminmax(u)
    if int(low) < 96 or int(high) > 159:
        return None
    return u.sub_(96), s_lo


PACK_ROWS = 8192
"""Rows :func:`pack6` lays out at a time."""


def pack6(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
          found: tuple[torch.Tensor, torch.Tensor] | None = None, variant: str | None = None,
          headers: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Two int4 planes in groups of 16 of 6-bit form (:func:`six_bit_codes`) as ``specchat_int6_mm``
    reads them: uint8 ``[N, stride]``, each row its codes (``K·3/4`` bytes: per 128 weights 64 bytes
    of nibbles, weight ``j`` low and ``j + 32`` high, then ``64 + j`` and ``96 + j``, and 32 bytes
    of top bits, byte ``j`` holding those of weights ``j``, ``32 + j``, ``64 + j``, ``96 + j``), then
    its bf16 scales, padded to 32 bytes: one stream a row, 7 bits a weight (Q6_K's 6.56). The
    second tensor is an empty table (the scales are in the rows). ``found``: :func:`six_bit_codes`'s
    answer for these planes, when the caller has it (it decodes every code: seconds for a large head).
    ``headers``: a Q6_K's own 18 bytes a super-block (16 int8 sub-scales, fp16 ``d``; :func:`check_headers`):
    then the rows hold only their codes (``K·3/4`` bytes) and the headers are the table, 6.56 bits a
    weight, and the kernel computes ``d·sc`` exactly instead of reading it rounded to bf16.
    """
    if codes.shape[0] > PACK_ROWS:  # rows are independent: a tall head in pieces (GBs of temporaries at once)
        pieces = [pack6(codes[r:r + PACK_ROWS], scale[r:r + PACK_ROWS], zero[r:r + PACK_ROWS],
                        None if found is None else (found[0][r:r + PACK_ROWS], found[1][r:r + PACK_ROWS]), variant,
                        None if headers is None else headers[r:r + PACK_ROWS])
                  for r in range(0, codes.shape[0], PACK_ROWS)]
        table = torch.cat([t for _, t in pieces]) if headers is not None else torch.empty(codes.shape[0], 0,
                                                                                          dtype=torch.uint8)
        return torch.cat([p for p, _ in pieces]), table
    found = found if found is not None else six_bit_codes(codes, scale, zero)
    if found is None:
        raise ValueError("these planes are not 6-bit weights (w = (q - 32) s, q in 0..63, groups of 16)")
    q, s = found
    n, k = q.shape
    if k % SIX_BIT_K_MULTIPLE:
        raise ValueError(f"6-bit weights need a multiple of {SIX_BIT_K_MULTIPLE} inputs, not {k}")
    if is_vnni(variant):
        q = vnni_order(q)
    chunks = q.reshape(n, k // 128, 4, 32)
    nibbles = torch.stack([chunks[:, :, 0] & 15 | (chunks[:, :, 1] & 15) << 4,
                           chunks[:, :, 2] & 15 | (chunks[:, :, 3] & 15) << 4], dim=2).reshape(n, k // 128, 64)
    top = chunks >> 4
    tops = top[:, :, 0] | top[:, :, 1] << 2 | top[:, :, 2] << 4 | top[:, :, 3] << 6
    if headers is not None:
        check_headers(headers, scale, zero, planes=2)
        return torch.cat([nibbles, tops], dim=2).reshape(n, -1).contiguous(), headers.to(torch.uint8).contiguous()
    row = k // 4 * 3 + k // 8
    stride = -(-row // 32) * 32
    out = torch.zeros(n, stride, dtype=torch.uint8)
    out[:, : k // 4 * 3] = torch.cat([nibbles, tops], dim=2).reshape(n, -1)
    out[:, k // 4 * 3 : row] = s.contiguous().view(torch.uint8)
    return out, torch.empty(n, 0, dtype=torch.uint8)


def unpack_codes(packed: torch.Tensor, k: int | None = None, variant: str | None = None) -> torch.Tensor:
    """The codes uint8 ``[N, planes·K]`` back from :func:`pack`'s ``packed`` (``k``, the inputs,
    for 6-bit rows, whose codes come back as the planes of ``q + 96``; ``variant``: the one it was
    packed for, else this process's)."""
    if packed.dim() == 4:  # Q4_K rows in tiles
        packed = untile(packed)[0]
    if is_vnni(variant):  # the VNNI order is its own inverse, plane by plane
        plain = unpack_codes(packed, k, "avx2")
        return torch.cat([vnni_order(p) for p in plain.split(plain.shape[1] // (1 if packed.dtype == torch.uint8
                                                                                   and (k is None or packed.shape[1] == k // 2) else 2), dim=1)], dim=1)
    if packed.dtype == torch.uint8 and k is not None and packed.shape[1] != k // 2:  # 6-bit rows
        n = packed.shape[0]
        body = packed[:, : k // 4 * 3].reshape(n, k // 128, 96)
        nib, tops = body[:, :, :64].reshape(n, k // 128, 2, 32), body[:, :, 64:]
        low = torch.stack([nib[:, :, 0] & 15, nib[:, :, 0] >> 4, nib[:, :, 1] & 15, nib[:, :, 1] >> 4], dim=2)
        top = torch.stack([(tops >> s) & 3 for s in (0, 2, 4, 6)], dim=2)
        u = (low | top << 4).reshape(n, k) + 96
        return torch.cat([u & 15, u >> 4], dim=1)
    if packed.dtype == torch.int8:  # two planes joined
        u = packed.view(torch.uint8) ^ 0x80
        return torch.cat([u & 0x0F, u >> 4], dim=1)
    n, half = packed.shape
    b = packed.reshape(n, half // 32, 1, 32)
    return torch.cat([b & 0x0F, b >> 4], dim=2).reshape(n, 2 * half)

