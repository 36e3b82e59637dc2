"""Which precision a run trains in when the user names none, decided once at the start from what the CPU has.

On a GPU accelerate's setting stands (`--training.mixed_precision` or the accelerate config). On a CPU, bf16 autocast
pays only where the CPU has bf16 units and the matrices are wide enough for them to matter; elsewhere it is far
slower than fp32, since every bf16 matmul is then emulated. Measured end to end (`bench/precision_runs.py`, the
records `bench/results/precision-end-to-end*.json`; `bench/precision.py` times the step alone):

- AMD EPYC with avx512_bf16, one thread: bf16 matmuls at 2.2x fp32's rate; pretraining the llama-preset decoder
  at width 256 ran at 1.41x fp32's tokens/s, the modernbert-preset encoder at width 128 at 1.13x, both at equal
  eval loss after 300 steps (3.842 against 3.843; 5.95 against 6.01).
- Intel Xeon with amx_bf16 and avx512_bf16, one thread: bf16 matmuls at 6.6x fp32's rate (2048-square), yet the
  same decoder at 1.33x and the same encoder at 0.99x (3.843 against 3.843; 5.94 against 6.01): the recipes'
  matrices are too small for the AMX tiles.
- AMD EPYC with AVX2 only: a tiny encoder's pretraining step took 25,724 ms in bf16 against 1,073 ms in fp32 (24x).

So a pretraining run that names no precision trains in bf16 on a CPU with bf16 units from `MIN_BF16_WIDTH` up, and
in fp32 everywhere else (fp32 stays the exactness reference: tests and the documented tiny runs are narrower). A
resumed run keeps the precision it started with, so that it continues exactly.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Mapping
from pathlib import Path

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
"""/proc/cpuinfo flags of native bf16 matmul units: Intel AMX and AVX-512 BF16 (x86), the BF16 extension (Arm)."""

MIN_BF16_WIDTH = 256
"""The narrowest hidden size at which bf16 is the default on a CPU with bf16 units: 1.41x (EPYC) and 1.33x (Xeon)
at 256 against 1.13x and 0.99x at 128 (module docstring), so below it the gain does not pay for the rounding."""

AVX2_BF16_SLOWDOWN = (
    "about 24x slower than fp32 (a tiny encoder's step: 25.7 s against 1.07 s on an AVX2 AMD EPYC)"
)

_ACCELERATORS_OFF = ("1", "true", "yes")


@functools.cache
def cpu_bf16_units(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, ...]:
    """The bf16 units this CPU announces (`BF16_CPU_FLAGS` found among its flags), () when none or unknown."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 and Arm name the line differently
            flags.update(value.split())
    return tuple(flag for flag in BF16_CPU_FLAGS if flag in flags)


def trains_on_cpu() -> bool:
    """Whether accelerate will put this run on the CPU: no GPU or other accelerator, or ACCELERATE_USE_CPU set."""
    if os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in _ACCELERATORS_OFF:
        return True
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return not accelerator.is_available()
    return not torch.cuda.is_available()


def choose_precision(
    given: str | None, model_width: int | None, saved: Mapping | None, on_cpu: bool, units: tuple[str, ...]
) -> tuple[str | None, str | None, bool]:
    """(the precision to run with, or None for accelerate's; a start line saying which and why when it is not
    the fp32 of every earlier Kiln, or None; whether that line is a warning). `given` is --training.mixed_precision, `model_width` the model's hidden size when the app
    knows it (None: not a run that decides), `saved` the config of the run being resumed."""
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    chosen = given if given is not None else (launched if launched != "no" else None)
    if chosen is None and saved is not None:
        # a resume continues in the precision its run started with, whatever this machine would choose
        chosen = (saved.get("training") or {}).get("mixed_precision")
        if chosen == "bf16" and on_cpu and units:
            return chosen, f"precision: bf16, as the resumed run started ({'+'.join(units)} here)", False
        if chosen == "bf16" and on_cpu:
            return (
                chosen,
                f"precision: bf16, as the resumed run started; on this CPU it is {AVX2_BF16_SLOWDOWN}",
                True,
            )
        return chosen, None, False
    if chosen is not None:
        if chosen == "bf16" and on_cpu and not units:
            return (
                chosen,
                f"--training.mixed_precision bf16 on a CPU without bf16 units ({platform.machine()}, no "
                f"{'/'.join(BF16_CPU_FLAGS[:2])}): {AVX2_BF16_SLOWDOWN}; --training.mixed_precision no trains in fp32",
                True,
            )
        return chosen, None, False
    if not on_cpu or model_width is None or not units:
        return None, None, False
    if model_width < MIN_BF16_WIDTH:
        return None, None, False  # fp32, as ever: nothing to say
    return (
        "bf16",
        f"precision: bf16 (this CPU has {'+'.join(units)}: 1.3-1.4x fp32's tokens/s at width 256, measured; "
        "--training.mixed_precision no trains in fp32)",
        False,
    )


__all__ = [
    "AVX2_BF16_SLOWDOWN",
    "BF16_CPU_FLAGS",
    "MIN_BF16_WIDTH",
    "choose_precision",
    "cpu_bf16_units",
    "trains_on_cpu",
]
