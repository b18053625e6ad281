"""The same CPU bits at any number of threads per process: MKL's strict reproducibility mode.

A float32 GEMM's rounding follows how MKL splits its sums among the threads, so without it a
run of 1 process with 2 threads and one of 2 processes with 1 thread each differ in their last
bits (sequence scores, BERTScore, COMET; a beam near a tie may even turn). MKL's strict
conditional numerical reproducibility mode (MKL_CBWR=...,STRICT) gives the same bits at any
number of threads. MKL takes the mode once, when it first computes, and keeps it for the life
of the process: `pin` sets it before the run's first model runs, and says what was in force, as
MKL reports it. Products 4 to 20 columns wide keep depending on MKL's threads even then: the
tool's own run on one MKL thread (`one_mkl_thread`), and so do a model metric's linear layers of
such a width (`narrow_on_one_mkl_thread`, recorded). docs/outputs.md, "What is identical", says
where this does not reach.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import ConfigError

logger = logging.getLogger("seq2seq_eval")

ENV = "MKL_CBWR"
DEFAULT = "AUTO,STRICT"
# mkl_cbwr.h: the branch is the low bits, STRICT a flag above them; -8 is
# MKL_CBWR_ERR_MODE_CHANGE_FAILURE, the answer once MKL has computed in another mode.
_ALL, _AUTO, _STRICT, _TOO_LATE = -1, 2, 0x10000, -8
OFF = "off: MKL computed before the run could set its strict mode"
"""What the provenance records where the mode could not be set (evaluate() in a process that had
computed on the CPU already): the outputs may then depend on the threads per process."""

_BRANCHES = {1: "BRANCH_OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 5: "SSE3", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2",
             9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1", 14: "AVX512_E1"}
"""mkl_cbwr.h's branch values, by the names MKL_CBWR takes."""

_state: list[str | None] = []  # what pin() found, once per process (MKL's mode cannot change after)


@functools.cache
def _torch_mkl() -> ctypes.CDLL | None:
    """torch's own MKL (statically linked into libtorch_cpu), or None where torch has none."""
    import torch

    name = {"win32": "torch_cpu.dll", "darwin": "libtorch_cpu.dylib"}.get(sys.platform, "libtorch_cpu.so")
    path = Path(torch.__file__).parent / "lib" / name
    if not torch.backends.mkl.is_available() or not path.is_file():
        return None
    lib = ctypes.CDLL(str(path))  # already loaded by torch: the same handle, the same MKL
    try:
        lib.mkl_serv_cbwr_get.restype = lib.mkl_serv_cbwr_set.restype = ctypes.c_int
        lib.MKL_Set_Num_Threads_Local.restype = ctypes.c_int  # the C interface (by value)
    except AttributeError:  # a build that does not export MKL's service functions
        return None
    return lib


def _given() -> str | None:
    """MKL_CBWR as the user set it, refused where it lacks STRICT."""
    given = os.environ.get(ENV)
    if given is not None and "STRICT" not in given.upper().replace(" ", "").split(","):
        raise ConfigError(f"environment variable {ENV}={given!r} lacks STRICT, so MKL's float sums would depend "
                          f"on the threads per process; set {ENV}={given},STRICT or leave it unset "
                          f"(seq2seq_eval then sets {DEFAULT})")
    return given


def in_force(code: int) -> str:
    """MKL's mode as mkl_cbwr_get reports it (`code`), in MKL_CBWR's words: `AUTO,STRICT`."""
    branch = code & ~_STRICT
    return _BRANCHES.get(branch, f"branch {branch}") + (",STRICT" if code & _STRICT else "")


def pin(device_type: str = "cpu") -> str | None:
    """Put MKL in strict mode before the process's first MKL call, and return the mode in force
    (recorded in the provenance): what MKL reports, read back from it (not what MKL_CBWR asked
    for: MKL ignores a value it does not take, and says so nowhere), `OFF` where the strict mode
    could not be set, or None where torch has no MKL. Warns, once, where the mode could not be
    set and the run computes on the CPU, and where MKL_CBWR asked for another mode than the one in
    force."""
    if _state:
        if _state[0] == OFF and device_type == "cpu":
            _warn()
        return _state[0]
    given = _given()
    # CTranslate2's MKL (its own, linked into its library) and any subprocess read the variable
    # when they start, which is after this.
    os.environ.setdefault(ENV, DEFAULT)
    lib = _torch_mkl()
    if lib is None:
        mode = None
    elif lib.mkl_serv_cbwr_get(_ALL) & _STRICT or lib.mkl_serv_cbwr_set(_AUTO | _STRICT) == 0:
        # Strict from the environment, or set here before MKL's first call: what MKL now reports.
        mode = in_force(lib.mkl_serv_cbwr_get(_ALL))
    else:
        mode = OFF
    _state.append(mode)
    if given is not None and mode is not None and mode != OFF and _words(given) != mode:
        logger.warning("%s=%s: MKL reports %s in force, which the provenance records", ENV, given, mode)
    if mode == OFF and device_type == "cpu":
        _warn()
    return mode


def _words(mode: str) -> str:
    return ",".join(part for part in mode.upper().replace(" ", "").split(",") if part)


@contextlib.contextmanager
def one_mkl_thread() -> Iterator[None]:
    """MKL on one thread for the calls this thread makes inside. For the GEMMs whose bits follow
    MKL's threads even in strict mode: on MKL 2024.2 (AMD EPYC, AVX-512), products with an output
    of 4 to 20 columns and fewer rows than columns, batched ones of one matrix too
    (docs/outputs.md); small, so one thread costs nothing that matters."""
    lib = _torch_mkl()
    if lib is None:
        yield
        return
    before = lib.MKL_Set_Num_Threads_Local(1)  # 0: this thread followed the global setting
    try:
        yield
    finally:
        lib.MKL_Set_Num_Threads_Local(before)


NARROW = range(4, 21)
"""Output widths of the products MKL's strict mode leaves depending on its threads on this
machine's MKL (one_mkl_thread; docs/outputs.md, "What is identical")."""


def narrow_layers(module: Any) -> list[str]:
    """`module`'s linear layers (torch.nn.Linear) whose output width is in NARROW, by name and width:
    `decoder.block.0.layer.2.DenseReluDense.wo (16)`. A model metric's own layers are at least a
    hidden size wide; a checkpoint with a hidden size this narrow (a test's tiny one) has these."""
    import torch

    return [f"{name} ({layer.out_features})" for name, layer in module.named_modules()
            if isinstance(layer, torch.nn.Linear) and layer.out_features in NARROW]


def narrow_on_one_mkl_thread(owner: Any, device_type: str = "cpu") -> list[str]:
    """Every narrow linear layer (narrow_layers) of the networks `owner` holds (itself, or its
    attributes that are torch modules: a loaded model metric) runs on one MKL thread, as
    one_mkl_thread runs the products the tool makes itself: then their bits do not depend on the
    threads per process, hence not on the layout. Returns what it covered, for the record; on a
    device other than the CPU, nothing (MKL computes only on the CPU)."""
    import torch

    if device_type != "cpu" or _torch_mkl() is None:
        return []
    modules = [owner] if isinstance(owner, torch.nn.Module) else [
        value for value in getattr(owner, "__dict__", {}).values() if isinstance(value, torch.nn.Module)]
    covered: list[str] = []
    for module in modules:
        for name, layer in module.named_modules():
            if isinstance(layer, torch.nn.Linear) and layer.out_features in NARROW:
                if not hasattr(layer, _HOOKED):  # a network met again (a cached model) is hooked once
                    layer.register_forward_pre_hook(_one_thread_in)
                    layer.register_forward_hook(_one_thread_out, always_call=True)  # restored after an error too
                    setattr(layer, _HOOKED, True)
                covered.append(f"{type(module).__name__}.{name} ({layer.out_features})")
    return covered


_HOOKED = "_seq2seq_eval_one_mkl_thread"
_before = threading.local()  # per calling thread: MKL's local setting before each layer, a stack


def _one_thread_in(_module: Any, _args: Any) -> None:
    lib = _torch_mkl()
    stack = getattr(_before, "stack", None) or []
    _before.stack = stack
    stack.append(lib.MKL_Set_Num_Threads_Local(1))


def _one_thread_out(_module: Any, _args: Any, _output: Any) -> None:
    stack = getattr(_before, "stack", None)
    if stack:
        _torch_mkl().MKL_Set_Num_Threads_Local(stack.pop())


_warned: list[bool] = []


def _warn() -> None:
    if not _warned:
        _warned.append(True)
        logger.warning("MKL computed in this process before seq2seq_eval could set its strict mode (%s=%s), "
                       "so CPU outputs may differ in their last bits with another number of threads per "
                       "process; set %s=%s in the environment before the process starts for the same bits "
                       "at any number of threads", ENV, DEFAULT, ENV, DEFAULT)
