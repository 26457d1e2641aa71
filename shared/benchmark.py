"""Measuring attention: device, timing, FLOP counts, bandwidth, peak memory, SDPA backends and the
machine's description.

Used by notebook 05 and by ``make bench`` (``tools/bench.py``). Every time in the course comes from
``torch.utils.benchmark`` (warm-up, synchronisation of CUDA kernels, repeated blocks, median) and
runs with the number of threads PyTorch itself uses (``torch.get_num_threads()``; the Timer's own
default would be one thread). :func:`interleaved_medians` runs several candidates in turns so a
noisy, shared machine slows all of them alike, and quotes the median over the rounds;
:func:`interleaved_best` quotes the fastest block instead (a busy neighbour only ever adds time).
:class:`SimulatedGPU` is a pretend asynchronous device with a virtual clock, for showing (and
checking) what synchronisation changes on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
import sys
import timeit
import warnings
from collections import Counter
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

__all__ = [
    "pick_device",
    "synchronize",
    "time_fn",
    "interleaved_times",
    "interleaved_medians",
    "interleaved_best",
    "best_times_ms",
    "timing_ways_ms",
    "minor_page_faults",
    "keep_freed_memory",
    "new_tensors_of_shape",
    "sdpa_backend_calls",
    "attention_flops",
    "gflops",
    "matmul_gflops",
    "naive_score_bytes",
    "attention_bytes",
    "peak_memory",
    "cpu_peak_memory",
    "cpu_memory_events",
    "quiet_stderr",
    "aten_ops",
    "op_self_ms",
    "profile_shares",
    "operation_count",
    "operation_counts",
    "sdpa_backends",
    "machine_info",
    "SimulatedGPU",
    "sdpa_kernel_used",
    "sdpa_backend_times",
    "memory_bandwidth",
    "device_memory_bytes",
    "naive_peak_bytes",
    "fits_in_memory",
    "is_out_of_memory",
    "dtype_works",
    "numpy_threads",
]


DEVICE_ENV = "COURSE_DEVICE"


def pick_device() -> torch.device:
    """CUDA if a GPU is visible, else Apple's MPS, else the CPU.

    The environment variable ``COURSE_DEVICE`` (``cpu``, ``cuda`` or ``mps``) overrides the choice:
    the tests set ``COURSE_DEVICE=cpu`` so that stored outputs, which come from the CPU, are
    reproduced on a Mac with MPS or a laptop with a GPU too. Asking for a device that is not
    there raises an error naming it."""
    wanted = os.environ.get(DEVICE_ENV, "").strip().lower()
    if wanted:
        if wanted not in ("cpu", "cuda", "mps"):
            raise ValueError(f"{DEVICE_ENV} must be 'cpu', 'cuda' or 'mps'; got {wanted!r}")
        mps = getattr(torch.backends, "mps", None)
        present = {"cpu": True, "cuda": torch.cuda.is_available(),
                   "mps": mps is not None and mps.is_available()}
        if not present[wanted]:
            raise RuntimeError(f"{DEVICE_ENV}={wanted} but torch sees no {wanted} device here")
        return torch.device(wanted)
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
    at least ``min_run_time`` seconds and returns their statistics. Its clock synchronises the
    device before every reading: the Timer's own default clock does so for CUDA (and, in recent
    PyTorch, for every accelerator); on MPS we pass a synchronising clock, since older versions
    do not. The Timer runs ``fn`` with ``num_threads=torch.get_num_threads()``, the threads
    PyTorch uses outside the timer (its own default, one thread, would make every CPU figure
    single-threaded)."""
    return _measurement(fn, device, min_run_time).median


def _measurement(fn: Callable[[], object], device="cpu", min_run_time: float = 0.2, clock=None):
    """The ``torch.utils.benchmark.Measurement`` behind :func:`time_fn` (``.times``: seconds per
    call of each block); ``clock`` replaces the Timer's clock (CPU only)."""
    _check_callable(fn)
    if min_run_time <= 0:
        raise ValueError(f"min_run_time must be positive; got {min_run_time}")
    from torch.utils import benchmark  # imported here: importing it costs half a second

    device = torch.device(device)
    kwargs = {}
    if device.type == "mps":
        def synchronised_clock() -> float:
            synchronize(device)
            return timeit.default_timer()

        kwargs["timer"] = synchronised_clock
    if clock is not None:
        if device.type != "cpu":
            raise ValueError(f"a custom clock is for CPU timings only (a GPU needs a synchronising "
                             f"one); got device {device.type!r}")
        kwargs["timer"] = clock
    fn()  # warm-up outside the measurement (first calls allocate and pick kernels)
    synchronize(device)
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads(),
                            **kwargs)
    return timer.blocked_autorange(min_run_time=min_run_time)


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


def interleaved_best(fns: dict[str, Callable[[], object]], device="cpu", rounds: int = 3,
                     min_run_time: float = 0.2, clock=None) -> dict[str, float]:
    """``{name: seconds per call of its fastest block}``, every candidate timed once per round, in
    turns, ``rounds`` times. A busy neighbour only ever adds time, so the fastest block is the
    figure it disturbed least; on a quiet machine it is close to the median.

    ``clock`` (CPU only) replaces the Timer's wall clock, e.g. ``time.process_time``: with one
    torch thread, the CPU time this process used, which leaves out the time the operating system
    gave the core to other processes (with several threads it would add theirs up)."""
    if not fns:
        raise ValueError("fns must name at least one function to time")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer; got {rounds!r}")
    best = {name: math.inf for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], min(_measurement(fn, device, min_run_time, clock).times))
    return best


def best_times_ms(fns: dict[str, Callable[[], object]], device="cpu", rounds: int = 3,
                  min_run_time: float = 0.02) -> dict[str, float]:
    """``{name: milliseconds per call}``: :func:`interleaved_best` (candidates timed in turns,
    ``rounds`` times, each keeping its fastest block), with the clock chosen for the device.

    With torch on one CPU thread the clock is ``time.process_time``, the CPU time this process
    used: it leaves out the moments the operating system gave the core to other programs, so a
    busy neighbour barely moves the figure. With several threads, or on a GPU, the Timer's own
    clock (wall time, synchronising the device before each reading) is kept: CPU time would add up
    the threads' times, and a GPU's work is not this process's CPU time at all."""
    import time

    one_cpu_thread = torch.device(device).type == "cpu" and torch.get_num_threads() == 1
    clock = time.process_time if one_cpu_thread else None
    best = interleaved_best(fns, device, rounds, min_run_time, clock)
    return {name: 1e3 * seconds for name, seconds in best.items()}


def timing_ways_ms(fn: Callable[[], object], device="cpu", rounds: int = 2,
                   min_run_time: float = 0.05) -> dict[str, float]:
    """``{way: milliseconds per call}`` of ``fn()`` timed three ways, in turns, ``rounds`` times,
    each way keeping its fastest figure: ``"bare clock"`` (``time.perf_counter`` around 5 calls,
    no synchronisation: on a GPU it sees only the launches), ``"Timer, 1 thread"``
    (``torch.utils.benchmark.Timer`` at its default ``num_threads=1``) and ``"time_fn"``
    (:func:`time_fn`: torch's own thread count, the device synchronised)."""
    _check_callable(fn)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer; got {rounds!r}")
    import time

    from torch.utils import benchmark

    bare = benchmark.Timer(stmt="fn()", globals={"fn": fn}, timer=time.perf_counter,
                           num_threads=torch.get_num_threads())
    one_thread = benchmark.Timer(stmt="fn()", globals={"fn": fn})  # num_threads=1
    ways = {"bare clock": lambda: bare.timeit(number=5).median,
            "Timer, 1 thread": lambda: one_thread.blocked_autorange(min_run_time=min_run_time)
            .median,
            "time_fn": lambda: time_fn(fn, device, min_run_time)}
    best = {way: math.inf for way in ways}
    for _ in range(rounds):  # in turns: a busy neighbour slows all alike; noise only adds time
        for way, measure in ways.items():
            best[way] = min(best[way], measure())
    return {way: 1e3 * seconds for way, seconds in best.items()}


def keep_freed_memory() -> bool:
    """Ask the C library's allocator to keep freed blocks of up to 32 MiB for reuse instead of
    handing them back to the operating system, as PyTorch's GPU caching allocator does. By default
    glibc returns large freed blocks, so a function that allocates large tensors on every call
    (naive attention's T x T buffers) page-faults fresh memory on each call, and how many faults
    depends on what earlier calls left behind. Afterwards such a call reuses pages it has already
    touched. Affects this process only; returns True where it took effect (Linux with glibc) and
    False elsewhere (macOS, Windows, musl), where nothing changes."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
    heap_blocks = mallopt(M_MMAP_THRESHOLD, 32 * 2**20)  # blocks up to 32 MiB from the heap
    keep_freed = mallopt(M_TRIM_THRESHOLD, 2**30)  # return freed heap only beyond 1 GiB
    return bool(heap_blocks and keep_freed)


def minor_page_faults(fn: Callable[[], object], calls: int = 3) -> float | None:
    """Minor page faults per call of ``fn()`` (after one untimed call), from
    ``resource.getrusage``: first touches of memory pages the C library has just taken fresh from
    the operating system. A function that allocates large fresh tensors on every call pays them;
    one that writes into buffers it already owns does not. ``None`` where the ``resource`` module
    does not exist (Windows)."""
    _check_callable(fn)
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be a positive integer; got {calls!r}")
    try:
        import resource
    except ImportError:  # Windows
        return None
    fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def new_tensors_of_shape(fn: Callable[[], object], shape: tuple[int, ...]) -> list[str]:
    """Run ``fn()`` once and return, in order, the names of the torch functions called from Python
    that returned a tensor of exactly ``shape`` in new memory (not a view of, or an in-place
    change to, one of their tensor arguments). A fused kernel that keeps such a tensor inside one
    call (SDPA) is not seen: only what reaches Python is counted."""
    _check_callable(fn)
    shape = tuple(int(n) for n in shape)
    calls: list[str] = []

    class _Recorder(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            if (isinstance(out, torch.Tensor) and tuple(out.shape) == shape
                    and out.untyped_storage().data_ptr() not in inputs):
                calls.append(getattr(func, "__name__", str(func)))
            return out

    with _Recorder():
        fn()
    return calls


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
    a reference point for what the machine's matrix library reaches. It is not a ceiling: a fused
    attention kernel may use faster paths than this one multiply (on CUDA, TF32 tensor cores for
    float32, which ``torch.matmul`` uses only when ``torch.backends.cuda.matmul.allow_tf32``)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    return gflops(2 * n**3, time_fn(lambda: a @ b, device, min_run_time))


def naive_score_bytes(B: int, H: int, T_q: int, T_k: int, dtype=torch.float32) -> int:
    """Bytes of one ``(B, H, T_q, T_k)`` score matrix: ``B * H * T_q * T_k * element size``.

    Naive attention holds at least one such buffer (the scores, then the weights)."""
    return B * H * T_q * T_k * torch.empty((), dtype=dtype).element_size()


def attention_bytes(B: int, H: int, T_q: int, T_k: int, head_dim: int, dtype=torch.float32,
                    fused: bool = True) -> int:
    """Bytes attention must move between the device's main memory and its compute units, at
    least: a fused kernel reads Q ``(B, H, T_q, d)``, K and V ``(B, H, T_k, d)`` and writes the
    output ``(B, H, T_q, d)`` once. An unfused one (``fused=False``) also writes the scores,
    reads them for the softmax, writes the weights and reads them again for ``P @ V``: four more
    passes over ``B * H * T_q * T_k`` elements. FLOPs divided by these bytes is the arithmetic
    intensity of the roofline model."""
    element = torch.empty((), dtype=dtype).element_size()
    io = B * H * (2 * T_q + 2 * T_k) * head_dim
    if not fused:
        io += 4 * B * H * T_q * T_k
    return io * element


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
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


def cpu_memory_events(fn: Callable[[], object]) -> list[tuple[int, int]]:
    """Every allocation and free that PyTorch's CPU allocator made during ``fn()``, in time order:
    a list of ``(time_ns, nbytes)``, ``nbytes`` positive for an allocation, negative for a free.

    Read from ``torch.profiler.profile(profile_memory=True)``'s ``[memory]`` events (the profiler
    exposes them only through its internal results object, read here so that callers need not).
    The result of ``fn`` is kept alive until the end, so it is never freed in the list."""
    _check_callable(fn)
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()  # noqa: F841  (alive until the profile ends, like a caller holding it)
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    return sorted(events, key=lambda event: event[0])


def cpu_peak_memory(fn: Callable[[], object]) -> int:
    """Peak bytes of CPU memory that ``fn()`` had allocated at once, beyond what existed before.

    Method: :func:`cpu_memory_events` lists every allocation (+bytes) and free (-bytes) in time
    order; summing them gives the bytes alive after each event; the maximum is the peak. The
    result of ``fn`` is kept alive until the end, so it counts (as it would on a GPU)."""
    alive = peak = 0
    for _, nbytes in cpu_memory_events(fn):
        alive += nbytes
        peak = max(peak, alive)
    return peak


def aten_ops(fn: Callable[[], object], prefix: str = "aten::") -> list[str]:
    """Sorted names of the operators ``fn()`` ran whose names start with ``prefix``, as recorded
    by ``torch.profiler`` (e.g. which kernel ``F.scaled_dot_product_attention`` dispatched to)."""
    _check_callable(fn)
    with quiet_stderr(), torch.profiler.profile() as prof:
        fn()
    return sorted({e.key for e in prof.key_averages() if e.key.startswith(prefix)})


def op_self_ms(fn: Callable[[], object], prefix: str = "aten::") -> dict[str, float]:
    """Where one call ``fn()`` spends its time: ``{operator name: self time in ms}`` for the
    operators whose names start with ``prefix``, from ``torch.profiler`` (self time excludes the
    operators an operator calls, so the values add up to the call's total without double
    counting). One call, so the numbers are as noisy as one timing: compare shares, not values."""
    _check_callable(fn)
    with quiet_stderr(), torch.profiler.profile() as prof:
        fn()
    return {e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages()
            if e.key.startswith(prefix)}


def profile_shares(fn: Callable[[], object], groups: dict[str, list[str] | tuple[str, ...]],
                   calls: int = 3) -> dict[str, float]:
    """Where ``fn()`` spends its time, by groups of ATen operators, from ``torch.profiler``.

    ``groups`` maps a label to operator names without the ``aten::`` prefix, e.g.
    ``{"matrix products": ["mm", "bmm"]}``. ``fn`` runs once to warm up, then ``calls`` times
    under the profiler. Returns ``{label: share}`` for every group, in order, each share the
    group's self time over the total self time of all ATen operators (0 to 1); then ``"other"``,
    the share of every operator not named (so the shares add up to 1); then ``"ms per call"``,
    the total self time divided by ``calls``. One operator may sit in one group only."""
    _check_callable(fn)
    if not isinstance(groups, dict) or not groups:
        raise TypeError("groups must be a non-empty dict {label: [operator names]}; "
                        f"got {groups!r}")
    seen: dict[str, str] = {}
    for label, ops in groups.items():
        if label in ("other", "ms per call"):
            raise ValueError(f"the group label {label!r} is reserved for the result; "
                             "choose another")
        if isinstance(ops, str) or not isinstance(ops, (list, tuple)) or not ops:
            raise TypeError(f"groups[{label!r}] must be a non-empty list of operator names such as "
                            f"['mm', 'bmm']; got {ops!r}")
        for op in ops:
            if not isinstance(op, str) or op.startswith("aten::"):
                raise ValueError(f"groups[{label!r}]: write operator names without 'aten::', "
                                 f"e.g. 'mm'; got {op!r}")
            if op in seen:
                raise ValueError(f"operator {op!r} is in two groups, {seen[op]!r} and {label!r}: "
                                 "it would be counted twice")
            seen[op] = label
    if not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be a positive int; got {calls!r}")
    fn()  # warm-up: first-call costs (allocations, dispatch caches) stay out of the profile
    self_ms = op_self_ms(lambda: [fn() for _ in range(calls)])
    total = sum(self_ms.values())
    if total <= 0:
        raise RuntimeError("the profiler saw no ATen operator time in fn(): "
                           "is there any PyTorch work in it?")
    shares = {label: sum(self_ms.get("aten::" + op, 0.0) for op in ops) / total
              for label, ops in groups.items()}
    shares["other"] = 1.0 - sum(shares.values())
    shares["ms per call"] = total / calls
    return shares


def operation_count(fn: Callable[[], object]) -> int:
    """How many PyTorch operations that compute something ``fn()`` runs: the ATen operators that
    reach a device kernel, seen through a ``TorchDispatchMode`` (views such as slicing and
    ``transpose`` and bare allocations (``empty``) are not counted). On a GPU each counted
    operation is at least one kernel launch."""
    _check_callable(fn)
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if not func.is_view and name not in ("empty", "empty_strided", "empty_like"):
                _Count.n += 1
            return func(*args, **(kwargs or {}))

    with _Count():
        fn()
    return _Count.n


def operation_counts(fn: Callable[[], object]) -> Counter:
    """``Counter({operator name: calls})`` of the PyTorch operations that compute something when
    ``fn()`` runs, counted like :func:`operation_count` (views and bare allocations left out), so
    ``operation_counts(fn).total() == operation_count(fn)``. Names are ATen's, without the
    ``aten::`` prefix and overload (``"bmm"``, ``"exp_"``, ``"scalar_tensor"``, ...)."""
    _check_callable(fn)
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Counter = Counter()

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if not func.is_view and name not in ("empty", "empty_strided", "empty_like"):
                counts[name] += 1
            return func(*args, **(kwargs or {}))

    with _Count():
        fn()
    return counts


def peak_memory(fn: Callable[[], object], device="cpu") -> int | None:
    """Peak bytes allocated by ``fn()`` on ``device`` beyond what was allocated before it.

    CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak, once a small matrix
    product has made cuBLAS allocate its workspace (kept for the session, not ``fn``'s memory).
    CPU: :func:`cpu_peak_memory` (the profiler's allocation events). MPS has no peak counter:
    ``None``."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.ones(8, 8, device=device) @ torch.ones(8, 8, device=device)  # cuBLAS workspace
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()  # noqa: F841
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type == "cpu":
        return cpu_peak_memory(fn)
    return None


SDPA_BACKENDS = ("flash", "mem_efficient", "cudnn", "math")


def _sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "mem_efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]


def sdpa_backends(device="cpu", dtype=torch.float32) -> dict[str, bool]:
    """Which ``F.scaled_dot_product_attention`` backends can serve ``dtype`` on ``device``:
    ``{name: usable}`` for flash, mem_efficient, cudnn and math.

    Each backend is forced in turn with ``torch.nn.attention.sdpa_kernel`` on a small
    ``(1, 2, 16, 64)`` problem; a backend that cannot serve it raises, which counts as unusable
    (the warnings PyTorch prints about why are silenced). Eligibility also depends on the shapes,
    masks and dropout of the real call: check the kernel that ran with :func:`sdpa_kernel_used`."""
    from torch.nn.attention import sdpa_kernel

    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    try:
        q = torch.randn(1, 2, 16, 64, generator=gen).to(device, dtype)
    except (RuntimeError, TypeError):  # the dtype does not exist on this device
        return dict.fromkeys(SDPA_BACKENDS, False)
    found = {}
    for name in SDPA_BACKENDS:
        try:
            with warnings.catch_warnings(), sdpa_kernel([_sdpa_backend(name)]):
                warnings.simplefilter("ignore")
                F.scaled_dot_product_attention(q, q, q)
            found[name] = True
        except (RuntimeError, TypeError):
            found[name] = False
    return found


# The ATen operator each SDPA backend runs as, as the profiler names it.
_SDPA_KERNEL_OPS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "mem_efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_attention_math_for_mps": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused (device-specific)",
}


def sdpa_kernel_used(fn: Callable[[], object]) -> list[tuple[str, str]]:
    """``[(backend, operator name), ...]`` for the SDPA kernels ``fn()`` actually ran, read from
    ``torch.profiler``'s operator names (e.g. ``("flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu")``). Empty if ``fn`` ran none."""
    ops = aten_ops(fn, prefix="aten::_scaled_dot_product")
    return [(_SDPA_KERNEL_OPS[op], op) for op in ops if op in _SDPA_KERNEL_OPS]


def sdpa_backend_calls(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                       causal: bool = False) -> dict[str, Callable[[], torch.Tensor]]:
    """``{backend name: fn}``, where ``fn()`` runs SDPA on ``Q, K, V`` with that backend forced
    (``torch.nn.attention.sdpa_kernel``), for the backends that accept these inputs (each is tried
    once; the others are left out). Time them with :func:`best_times_ms` or :func:`time_fn`.

    Shapes: Q ``(..., T_q, d_k)``, K ``(..., T_k, d_k)``, V ``(..., T_k, d_v)``, on one device."""
    from torch.nn.attention import sdpa_kernel

    calls = {}
    for name in SDPA_BACKENDS:
        backend = _sdpa_backend(name)

        def call(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(Q, K, V, is_causal=causal)

        try:
            with warnings.catch_warnings():  # a backend that declines says why in a warning
                warnings.simplefilter("ignore")
                call()
        except (RuntimeError, TypeError) as err:
            if is_out_of_memory(err):
                raise
            continue
        calls[name] = call
    return calls


def sdpa_backend_times(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, causal: bool = False,
                       min_run_time: float = 0.2) -> dict[str, float]:
    """Median seconds per call of SDPA on ``Q, K, V`` with each backend forced in turn, for the
    backends that accept these inputs (the others are left out): ``{name: seconds}``.

    Shapes: Q ``(..., T_q, d_k)``, K ``(..., T_k, d_k)``, V ``(..., T_k, d_v)``, on one device."""
    return {name: time_fn(call, Q.device, min_run_time)
            for name, call in sdpa_backend_calls(Q, K, V, causal).items()}


def memory_bandwidth(device="cpu", mib: int | None = None, min_run_time: float = 0.2) -> float:
    """GB/s (10^9 bytes per second) that copying one large float32 tensor into another reaches on
    ``device``: each copy reads and writes ``mib`` MiB (default 256 on a GPU, 64 on the CPU, far
    larger than the caches), so it moves ``2 * mib`` MiB."""
    device = torch.device(device)
    if mib is None:
        mib = 64 if device.type == "cpu" else 256
    n = mib * 2**20 // 4
    a = torch.ones(n, device=device)
    b = torch.empty_like(a)
    seconds = time_fn(lambda: b.copy_(a), device, min_run_time)
    return 2 * a.numel() * a.element_size() / seconds / 1e9


def device_memory_bytes(device="cpu") -> int:
    """Bytes the device can still give out: CUDA's free memory (``torch.cuda.mem_get_info``),
    MPS's recommended working-set size minus what it holds, else the CPU's available RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "mps":
        total = getattr(torch.mps, "recommended_max_memory", None)
        if total is not None:
            return int(total() - torch.mps.driver_allocated_memory())
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not a POSIX system: assume 4 GiB
        return 4 * 2**30


def naive_peak_bytes(B: int, H: int, T_q: int, T_k: int, head_dim: int,
                     dtype=torch.float32) -> int:
    """What naive attention needs at its peak, as measured in notebook 05: three score-sized
    buffers (scores, weights, their masked-row cleanup) and the output ``(B, H, T_q, head_dim)``."""
    element = torch.empty((), dtype=dtype).element_size()
    return 3 * naive_score_bytes(B, H, T_q, T_k, dtype) + B * H * T_q * head_dim * element


def fits_in_memory(nbytes: int, device="cpu", fraction: float = 0.5) -> bool:
    """Whether ``nbytes`` is at most ``fraction`` of what :func:`device_memory_bytes` reports."""
    return nbytes <= fraction * device_memory_bytes(device)


def is_out_of_memory(err: BaseException) -> bool:
    """True for a device's out-of-memory error: ``torch.OutOfMemoryError`` (CUDA) or the
    RuntimeError MPS and the CPU allocator raise ("out of memory", "can't allocate memory")."""
    if isinstance(err, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text or "not enough memory" in text
    )


def dtype_works(device="cpu", dtype=torch.bfloat16, shape=(1, 8, 256, 64)) -> bool:
    """Whether ``F.scaled_dot_product_attention`` runs in ``dtype`` on ``device`` for inputs of
    ``shape`` ``(..., T, head_dim)`` (Q, K and V all of that shape).

    Probe with the shape you will really use: whether a dtype works can depend on it. bfloat16
    needs macOS 14 or later on Apple's MPS; on a CPU with AMX, when torch's kernels are limited to
    AVX2 (``ATEN_CPU_CAPABILITY=avx2``), the CPU flash kernel packs bfloat16 matrices for AMX
    only when there are at least 4 heads and head_dim is a multiple of 64, and then raises, while
    a tiny probe passes. A dtype that fails here is reported unusable instead of crashing later."""
    shape = tuple(shape)
    if len(shape) < 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                 for n in shape):
        raise ValueError(f"shape must be (..., T, head_dim) of positive integers; got {shape!r}")
    try:
        q = torch.zeros(shape).to(torch.device(device), dtype)
        F.scaled_dot_product_attention(q, q, q)
        return True
    except (RuntimeError, TypeError):
        return False


def numpy_threads() -> int | None:
    """The number of threads NumPy's BLAS uses now (via ``threadpoolctl``), or None if unknown."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    return max(blas) if blas else None


class SimulatedGPU:
    """A pretend asynchronous device with a virtual clock, for timing lessons without a GPU.

    ``launch()`` costs the host ``launch_s`` seconds and queues one kernel, which runs for
    ``first_s`` the first time (allocation, kernel selection) and ``kernel_s`` after that, once
    the kernels queued before it have finished. ``synchronize()`` waits (moves the clock on) until
    the queue is empty; ``clock()`` reads the host's time. ``log`` records every event in order:
    ``("launch", n)`` for the n-th launch, ``("sync",)`` and ``("clock", t, busy)`` with
    ``busy`` True when unfinished kernels were queued at that read.

    A busy neighbour: the kernels numbered in ``slow_calls`` (0-based launch order, e.g.
    ``range(10, 25)``) run ``slow_x`` times longer than ``kernel_s``.

    ``sync_s`` (default 0) is the host's own cost of each ``synchronize()``, paid after the queue
    has drained: a block of calls timed between two synchronised clock readings then carries one
    launch and one ``sync_s`` that no kernel hides."""

    def __init__(self, kernel_s: float = 2e-3, first_s: float = 50e-3, launch_s: float = 5e-6,
                 slow_calls=range(0), slow_x: float = 1.0, sync_s: float = 0.0):
        if not slow_x > 0:
            raise ValueError(f"slow_x must be a factor > 0, got {slow_x!r}")
        if not sync_s >= 0:
            raise ValueError(f"sync_s must be a time >= 0, got {sync_s!r}")
        self.kernel_s, self.first_s, self.launch_s = kernel_s, first_s, launch_s
        self.sync_s = sync_s
        self.slow_calls, self.slow_x = slow_calls, slow_x
        self.now = 0.0
        self.busy_until = 0.0
        self.calls = 0
        self.log: list[tuple] = []

    @property
    def busy(self) -> bool:
        """Are kernels still queued or running?"""
        return self.busy_until > self.now

    def launch(self, *args, **kwargs) -> None:
        self.now += self.launch_s
        start = max(self.now, self.busy_until)
        slow = self.slow_x if self.calls in self.slow_calls else 1.0
        self.busy_until = start + (self.first_s if self.calls == 0 else self.kernel_s * slow)
        self.calls += 1
        self.log.append(("launch", self.calls))

    def synchronize(self) -> None:
        self.now = max(self.now, self.busy_until) + self.sync_s
        self.log.append(("sync",))

    def clock(self) -> float:
        self.log.append(("clock", self.now, self.busy))
        return self.now

    def synchronized_clock(self) -> float:
        """``synchronize()`` then ``clock()``: what ``torch.utils.benchmark`` reads on CUDA."""
        self.synchronize()
        return self.clock()


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
        "torch threads (used by every timing)": str(torch.get_num_threads()),
        "NumPy BLAS threads": str(numpy_threads()),
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
