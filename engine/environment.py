"""The ``SPECCHAT_*`` switches and numbers that steer the engine and the app, each read here.

A value none of them can use is a :class:`~engine.errors.SettingError` that names the variable
and what it takes, raised where the value is read and, for every one of them at once, by
:func:`check` when a command starts. Variables that name things are read where the names are
known (``SPECCHAT_COMPILE``: a compiler backend) and paths where they are used. Before, ``SPECCHAT_UI_NICE=abc`` ended the app with a traceback as
its model became ready, and ``SPECCHAT_THREADS=abc`` failed every profile's load with
"invalid literal for int()", naming no variable.
"""
from __future__ import annotations

import os
import re

from engine.errors import SettingError

ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")
"""What a switch may say (any case)."""

SWITCHES = ("SPECCHAT_STATIC_CACHE", "SPECCHAT_CUDA_GRAPHS", "SPECCHAT_CARD_ATTENTION")
"""Variables that turn a thing on or off (unset: the device's default)."""
THREADS = "SPECCHAT_THREADS"
MAX_THREADS = 1024
"""The most threads ``SPECCHAT_THREADS`` and ``--threads`` take: torch segfaults given 100,000 (the
thread pool is made at the first kernel, or at exit) and overflows past a C long; no machine here
has this many cores."""
UI_NICE = "SPECCHAT_UI_NICE"
CHAIN = "SPECCHAT_CHAIN"
DEVICE = "SPECCHAT_DEVICE"
_DEVICE_NAME = re.compile(r"^(cpu|cuda(:\d+)?)$")
CPU_KERNEL = "SPECCHAT_CPU_KERNEL"
KERNEL_VARIANTS = ("avx512-vnni", "avx-vnni", "avx2")
"""The variants of specchat's CPU kernel, the preferred first (the CPU flags each needs:
:data:`engine.quant.cpu_isa.VARIANTS`)."""
KERNEL_ALIASES = {"avx512": "avx512-vnni", "avx512vnni": "avx512-vnni", "avxvnni": "avx-vnni", "auto": ""}


def _value(name: str) -> str:
    return os.environ.get(name, "").strip()


def switch(name: str) -> bool | None:
    """What the switch ``name`` says: True (:data:`ON`), False (:data:`OFF`) or None (unset)."""
    value = _value(name)
    if not value:
        return None
    if value.lower() in ON:
        return True
    if value.lower() in OFF:
        return False
    raise SettingError(f"{name}={value!r}: use 1 or 0 (on or off), or unset it for the default")


def whole(name: str, low: int, high: int | None = None) -> int | None:
    """The whole number ``name`` holds, from ``low`` to ``high``; None when unset."""
    value = _value(name)
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < low or (high is not None and number > high):
        span = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise SettingError(f"{name}={value!r}: give a whole number {span}, or unset it")
    return number


def threads() -> int | None:
    """``SPECCHAT_THREADS``: the engine's torch threads, 1 to :data:`MAX_THREADS`; None when unset.
    Before, 100000 failed the app's load with "can't start new thread" or an engine that died
    saying nothing."""
    return whole(THREADS, 1, MAX_THREADS)


def device_override() -> str | None:
    """``SPECCHAT_DEVICE`` (``cpu``, ``cuda`` or ``cuda:N``), or None when unset. Whether a card is
    there is for the loader to say (:func:`engine.model.device.choose_device`)."""
    value = _value(DEVICE).lower()
    if not value:
        return None
    if not _DEVICE_NAME.match(value):
        raise SettingError(f"{DEVICE}={_value(DEVICE)!r}: use cpu, cuda or cuda:N (a card's number), or unset it")
    return value


def cpu_kernel() -> str:
    """What ``SPECCHAT_CPU_KERNEL`` asks for: ``torch`` (torch's int4 kernel), one of
    :data:`KERNEL_VARIANTS`, or "" (unset or ``auto``: the best variant the CPU has). Before, a value
    that was none of them (``avx5l2``) fell back to torch's kernel, slower, with no word."""
    value = _value(CPU_KERNEL).lower()
    name = KERNEL_ALIASES.get(value, value)
    if name and name != "torch" and name not in KERNEL_VARIANTS:
        raise SettingError(f"{CPU_KERNEL}={_value(CPU_KERNEL)!r}: use auto, torch or one of "
                           f"{', '.join(KERNEL_VARIANTS)}, or unset it")
    return name


def check() -> None:
    """Read every variable here once, raising the first :class:`SettingError`."""
    for name in SWITCHES:
        switch(name)
    threads()
    whole(UI_NICE, 0, 19)
    whole(CHAIN, 0)
    device_override()
    cpu_kernel()
