"""Measuring attention: device, timing, FLOP counts, peak memory and the machine's description.

Used by notebook 05 and by ``make bench`` (``tools/bench.py``). Every time in the course comes from
``torch.utils.benchmark`` (warm-up, synchronisation of CUDA kernels, repeated blocks, median);
:func:`interleaved_medians` runs several candidates in turns so a noisy, shared machine slows all of
them alike, and quotes the median over the rounds.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import sys
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.utils import benchmark

__all__ = [
    "pick_device",
    "synchronize",
    "time_fn",
    "interleaved_times",
    "interleaved_medians",
    "attention_flops",
    "gflops",
    "matmul_gflops",
    "naive_score_bytes",
    "peak_memory",
    "cpu_peak_memory",
    "aten_ops",
    "sdpa_backends",
    "machine_info",
]


def pick_device() -> torch.device:
    """CUDA if a GPU is visible, else Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def synchronize(device) -> None:
    """Wait until every kernel queued on ``device`` has finished (a no-op on the CPU).

    GPU calls return as soon as the kernel is *queued*; a clock read right after measures the
    queueing, not the work. Synchronising first makes the clock see the finished result."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _check_callable(fn) -> None:
    if not callable(fn):
        raise TypeError(f"expected a callable taking no arguments; got {type(fn).__name__}")


def time_fn(fn: Callable[[], object], device="cpu", min_run_time: float = 0.2) -> float:
    """Median seconds per call of ``fn()``, measured with ``torch.utils.benchmark``.

    ``Timer.blocked_autorange`` warms up, picks how many calls make one block, repeats blocks for
    at least ``min_run_time`` seconds and returns their statistics; CUDA is synchronised by the
    timer itself, MPS by a synchronize after each call."""
    _check_callable(fn)
    if min_run_time <= 0:
        raise ValueError(f"min_run_time must be positive; got {min_run_time}")
    device = torch.device(device)
    if device.type == "mps":
        stmt, env = "fn(); sync(device)", {"fn": fn, "sync": synchronize, "device": device}
    else:
        stmt, env = "fn()", {"fn": fn}
    fn()  # warm-up outside the measurement (first calls allocate and pick kernels)
    synchronize(device)
    timer = benchmark.Timer(stmt=stmt, globals=env)
    return timer.blocked_autorange(min_run_time=min_run_time).median


def interleaved_times(fns: dict[str, Callable[[], object]], device="cpu", rounds: int = 3,
                      min_run_time: float = 0.2) -> dict[str, list[float]]:
    """``{name: [seconds per call in round 1, round 2, ...]}``, timing every candidate once per
    round, in turns, ``rounds`` times (each figure from :func:`time_fn`).

    A busy neighbour on a shared machine then slows every candidate of the same round alike."""
    if not fns:
        raise ValueError("fns must name at least one function to time")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer; got {rounds!r}")
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_fn(fn, device, min_run_time))
    return times


def interleaved_medians(fns: dict[str, Callable[[], object]], device="cpu", rounds: int = 3,
                        min_run_time: float = 0.2) -> dict[str, float]:
    """``{name: median seconds per call}`` over the rounds of :func:`interleaved_times`; the
    median discards the rounds a neighbour disturbed most."""
    times = interleaved_times(fns, device, rounds, min_run_time)
    return {name: statistics.median(ts) for name, ts in times.items()}


def attention_flops(B: int, H: int, T_q: int, T_k: int, head_dim: int, causal: bool = False) -> int:
    """Floating-point operations of attention's two matrix products, counting only useful work.

    ``Q K^T`` and ``P V`` each cost ``2 * head_dim`` operations (a multiply and an add) per
    (query, key) pair, so ``4 * B * H * pairs * head_dim``. Without a mask ``pairs = T_q * T_k``;
    with a causal mask only the pairs ``j <= i`` count (about half). Softmax is not counted."""
    for name, value in (("B", B), ("H", H), ("T_q", T_q), ("T_k", T_k), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    if causal:
        n = min(T_q, T_k)  # rows 0..n-1 see i + 1 keys, the rows after that see all T_k
        pairs = n * (n + 1) // 2 + (T_q - n) * T_k
    else:
        pairs = T_q * T_k
    return 4 * B * H * pairs * head_dim


def gflops(flops: float, seconds: float) -> float:
    """Achieved rate in GFLOP/s (10^9 operations per second)."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive; got {seconds}")
    return flops / seconds / 1e9


def matmul_gflops(n: int = 2048, device="cpu", dtype=torch.float32,
                  min_run_time: float = 0.3) -> float:
    """GFLOP/s of one ``(n, n) @ (n, n)`` matrix multiply (``2 n^3`` operations) on ``device``:
    what the machine's BLAS reaches, the ceiling for attention built from matrix products."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    return gflops(2 * n**3, time_fn(lambda: a @ b, device, min_run_time))


def naive_score_bytes(B: int, H: int, T_q: int, T_k: int, dtype=torch.float32) -> int:
    """Bytes of one ``(B, H, T_q, T_k)`` score matrix: ``B * H * T_q * T_k * element size``.

    Naive attention holds at least one such buffer (the scores, then the weights)."""
    return B * H * T_q * T_k * torch.empty((), dtype=dtype).element_size()


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 for a moment: the profiler's C++ library prints start/stop lines
    with timestamps there, which would clutter (and change) every output that uses it."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (some embedded interpreters): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def cpu_peak_memory(fn: Callable[[], object]) -> int:
    """Peak bytes of CPU memory that ``fn()`` had allocated at once, beyond what existed before.

    Method: ``torch.profiler.profile(profile_memory=True)`` records every allocation and free made
    by PyTorch's CPU allocator as a ``[memory]`` event with a signed size and a timestamp. Sorting
    them by time and summing gives the bytes alive after each event; the maximum is the peak. The
    result of ``fn`` is kept alive until the end, so it counts (as it would on a GPU)."""
    _check_callable(fn)
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()  # noqa: F841  (alive until the profile ends, like a caller holding it)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    alive = peak = 0
    for e in events:
        if e.device_type() == DeviceType.CPU:
            alive += e.nbytes()
            peak = max(peak, alive)
    return peak


def aten_ops(fn: Callable[[], object], prefix: str = "aten::") -> list[str]:
    """Sorted names of the operators ``fn()`` ran whose names start with ``prefix``, as recorded
    by ``torch.profiler`` (e.g. which kernel ``F.scaled_dot_product_attention`` dispatched to)."""
    _check_callable(fn)
    with _quiet_stderr(), torch.profiler.profile() as prof:
        fn()
    return sorted({e.key for e in prof.key_averages() if e.key.startswith(prefix)})


def peak_memory(fn: Callable[[], object], device="cpu") -> int | None:
    """Peak bytes allocated by ``fn()`` on ``device`` beyond what was allocated before it.

    CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak. CPU: :func:`cpu_peak_memory`
    (the profiler's allocation events). MPS offers no peak counter: ``None``."""
    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()  # noqa: F841
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type == "cpu":
        return cpu_peak_memory(fn)
    return None


def sdpa_backends(device="cpu") -> dict[str, bool]:
    """Which ``F.scaled_dot_product_attention`` backends run here: ``{name: works}``.

    Each backend is forced in turn with ``torch.nn.attention.sdpa_kernel`` on a small float32
    (and, on a GPU, float16) problem; a backend that cannot serve it raises, which counts as
    unavailable."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device = torch.device(device)
    names = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "mem_efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }
    dtypes = [torch.float32] if device.type == "cpu" else [torch.float16, torch.float32]
    found = {}
    for name, backend in names.items():
        works = False
        for dtype in dtypes:
            gen = torch.Generator().manual_seed(0)
            q = torch.randn(1, 2, 16, 64, generator=gen).to(device, dtype)
            try:
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(q, q, q)
                works = True
                break
            except RuntimeError:
                continue
        found[name] = works
    return found


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_info(device="cpu") -> dict[str, str]:
    """What the numbers were measured on: CPU model and cores, GPU name, library versions."""
    import numpy as np

    device = torch.device(device)
    info = {
        "device": device.type,
        "cpu": _cpu_model(),
        "cpu cores (os.cpu_count)": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else (
            "Apple GPU (MPS)" if device.type == "mps" else "none"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "os": f"{platform.system()} {platform.release()}",
    }
    if device.type == "cpu":
        info["cpu capability"] = torch.backends.cpu.get_cpu_capability()
    return info
