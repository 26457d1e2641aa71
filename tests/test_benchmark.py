"""shared.benchmark: FLOP and byte counts by hand, timers against a known sleep, memory against
allocations of known size."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from shared.benchmark import (
    SimulatedGPU,
    aten_ops,
    attention_bytes,
    attention_flops,
    best_times_ms,
    cpu_memory_events,
    cpu_peak_memory,
    device_memory_bytes,
    dtype_works,
    fits_in_memory,
    gflops,
    interleaved_best,
    interleaved_medians,
    is_out_of_memory,
    machine_info,
    memory_bandwidth,
    minor_page_faults,
    naive_peak_bytes,
    naive_score_bytes,
    new_tensors_of_shape,
    numpy_threads,
    op_self_ms,
    operation_count,
    peak_memory,
    pick_device,
    profile_shares,
    sdpa_backend_calls,
    sdpa_backend_times,
    sdpa_backends,
    sdpa_kernel_used,
    synchronize,
    time_fn,
    timing_ways_ms,
)

ROOT = Path(__file__).resolve().parents[1]


def test_attention_flops_by_hand():
    # Q K^T: T_q*T_k dot products of length d (2d ops each); P V the same again.
    assert attention_flops(1, 1, 2, 3, 4) == 2 * (2 * 3 * 4) * 2
    assert attention_flops(2, 8, 4096, 4096, 64) == 4 * 2 * 8 * 4096 * 4096 * 64


def test_attention_flops_causal_counts_the_lower_triangle():
    # T = 4: rows see 1, 2, 3, 4 keys -> 10 pairs of the 16.
    assert attention_flops(1, 1, 4, 4, 1, causal=True) == 4 * 10
    # T_q = 5 > T_k = 3 (top-left aligned): rows see 1, 2, 3, 3, 3 keys -> 12 pairs.
    assert attention_flops(1, 1, 5, 3, 1, causal=True) == 4 * 12
    # T_q = 2 < T_k = 6: rows see 1, 2 keys -> 3 pairs.
    assert attention_flops(1, 1, 2, 6, 1, causal=True) == 4 * 3


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_attention_flops_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="must be a positive integer"):
        attention_flops(1, bad, 4, 4, 8)


def test_gflops():
    assert gflops(3e9, 1.5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="seconds must be positive"):
        gflops(1.0, 0.0)


def test_naive_score_bytes_formula():
    assert naive_score_bytes(1, 8, 4096, 4096) == 8 * 4096 * 4096 * 4 == 512 * 2**20
    assert naive_score_bytes(2, 3, 5, 7, torch.float16) == 2 * 3 * 5 * 7 * 2
    assert naive_score_bytes(1, 1, 2, 2, torch.float64) == 32


def test_pick_device_is_available():
    device = pick_device()
    assert device.type in {"cuda", "mps", "cpu"}
    torch.zeros(1, device=device)  # usable
    synchronize(device)


def test_time_fn_measures_a_known_sleep():
    seconds = time_fn(lambda: time.sleep(0.005), min_run_time=0.05)
    assert 0.004 < seconds < 0.05


def test_time_fn_rejects_bad_input():
    with pytest.raises(TypeError, match="callable"):
        time_fn(3)
    with pytest.raises(ValueError, match="min_run_time must be positive"):
        time_fn(lambda: None, min_run_time=0)


def test_interleaved_best_keeps_the_fastest_block_and_ignores_a_disturbed_call():
    """Sleeps of 1 ms and 4 ms, the fast one disturbed (30 ms) on every third call: the fastest
    block is still about 1 ms, where a median over blocks of one call each could be pulled up."""
    calls = []

    def fast():
        calls.append(1)
        time.sleep(0.03 if len(calls) % 3 == 0 else 0.001)

    times = interleaved_best({"fast": fast, "slow": lambda: time.sleep(0.004)}, rounds=2, min_run_time=0.02)
    assert list(times) == ["fast", "slow"]
    assert 0.0009 < times["fast"] < 0.003 < 0.0039 < times["slow"] < 0.02
    busy = interleaved_best({"sleep": lambda: time.sleep(0.002), "work": lambda: sum(range(20_000))},
                            rounds=1, min_run_time=0.01, clock=time.process_time)
    assert busy["sleep"] < 0.001 < 0.002  # CPU time: a sleeping process uses (almost) none
    assert busy["work"] > 0
    with pytest.raises(ValueError, match="CPU timings only"):
        interleaved_best({"f": lambda: None}, device="cuda", clock=time.process_time)
    with pytest.raises(ValueError, match="rounds must be a positive integer"):
        interleaved_best({"f": lambda: None}, rounds=0)
    with pytest.raises(ValueError, match="at least one"):
        interleaved_best({})


def test_interleaved_medians_orders_a_fast_and_a_slow_function():
    times = interleaved_medians({"fast": lambda: time.sleep(0.001), "slow": lambda: time.sleep(0.004)},
                                rounds=3, min_run_time=0.02)
    assert list(times) == ["fast", "slow"]
    assert 0.0009 < times["fast"] < times["slow"] < 0.05
    with pytest.raises(ValueError, match="rounds must be a positive integer"):
        interleaved_medians({"f": lambda: None}, rounds=0)
    with pytest.raises(ValueError, match="at least one"):
        interleaved_medians({})


def test_cpu_peak_memory_of_known_allocations():
    n = 1_000_000  # float32: 4 MB each

    def two_at_once():
        a = torch.empty(n)
        b = torch.empty(n)
        return a.numel() + b.numel()

    def one_after_another():
        for _ in range(3):
            a = torch.empty(n)
            del a
        return torch.empty(n)  # the result stays alive: counted

    assert cpu_peak_memory(two_at_once) == 2 * 4 * n
    assert cpu_peak_memory(one_after_another) == 4 * n
    assert peak_memory(lambda: torch.empty(n, dtype=torch.float64), "cpu") == 8 * n


def test_cpu_memory_events_list_allocations_and_frees_in_time_order():
    n = 1_000_000

    def allocate_free_allocate():
        a = torch.empty(n)  # 4n bytes
        del a  # -4n
        return torch.empty(2 * n, dtype=torch.float64)  # 16n, kept alive: never freed

    events = cpu_memory_events(allocate_free_allocate)
    assert [nbytes for _, nbytes in events] == [4 * n, -4 * n, 16 * n]
    times = [t for t, _ in events]
    assert times == sorted(times)
    with pytest.raises(TypeError, match="callable"):
        cpu_memory_events(torch.empty(1))


def test_naive_attention_peak_is_at_least_the_score_matrix():
    from shared.modules import naive_attention

    gen = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(1, 2, 128, 16, generator=gen) for _ in range(3))
    assert cpu_peak_memory(lambda: naive_attention(Q, K, V)) >= naive_score_bytes(1, 2, 128, 128)


def test_sdpa_backends_on_this_machine():
    found = sdpa_backends(pick_device())
    assert set(found) == {"flash", "mem_efficient", "math", "cudnn"}
    assert found["math"]  # the reference implementation runs everywhere


def test_machine_info_describes_the_machine():
    info = machine_info("cpu")
    assert info["torch"] == torch.__version__
    assert int(info["cpu cores (os.cpu_count)"]) >= 1
    assert info["gpu"] == "none"


def test_aten_ops_names_the_operators_that_ran():
    a = torch.ones(3, 3)
    assert "aten::mm" in aten_ops(lambda: a @ a)
    assert aten_ops(lambda: a @ a, prefix="aten::mm") == ["aten::mm"]


def test_op_self_ms_finds_where_the_time_goes():
    a, small = torch.randn(256, 256), torch.randn(4, 4)
    times = op_self_ms(lambda: (a @ a @ a @ a, small + 1))  # three 256^3 products, one tiny add
    assert set(times) >= {"aten::mm", "aten::add"}
    assert all(t >= 0 for t in times.values())
    assert times["aten::mm"] > times["aten::add"]  # 3 x 33 MFLOP vs 16 additions
    assert list(op_self_ms(lambda: a @ a, prefix="aten::mm")) == ["aten::mm"]
    with pytest.raises(TypeError, match="callable"):
        op_self_ms(a)


def test_profile_shares_puts_the_time_in_the_right_group():
    a, small = torch.randn(256, 256), torch.randn(4, 4)
    calls = []

    def fn():
        calls.append(1)
        return a @ a @ a @ a, small + 1  # three 256^3 products (100 MFLOP), one 16-element add

    shares = profile_shares(fn, {"add": ["add"], "products": ["mm"]}, calls=2)
    assert list(shares) == ["add", "products", "other", "ms per call"]
    assert len(calls) == 3  # one warm-up call, then 2 profiled
    assert shares["products"] > 0.5 > shares["add"]  # the products dominate
    assert abs(sum(v for k, v in shares.items() if k != "ms per call") - 1) < 1e-9
    assert all(0 <= v <= 1 for k, v in shares.items() if k not in ("other", "ms per call"))
    assert shares["ms per call"] > 0
    # the same call with the products not named: their time moves to "other"
    assert profile_shares(fn, {"add": ["add"]}, calls=2)["other"] > 0.5


@pytest.mark.parametrize("groups, error, match", [
    ({}, TypeError, "non-empty dict"),
    ({"products": "mm bmm"}, TypeError, "list of operator names"),
    ({"products": ["aten::mm"]}, ValueError, "without 'aten::'"),
    ({"a": ["mm"], "b": ["bmm", "mm"]}, ValueError, "two groups"),
    ({"other": ["mm"]}, ValueError, "reserved"),
])
def test_profile_shares_rejects_bad_groups(groups, error, match):
    a = torch.ones(3, 3)
    with pytest.raises(error, match=match):
        profile_shares(lambda: a @ a, groups)


def test_profile_shares_rejects_bad_calls_and_fn():
    a = torch.ones(3, 3)
    with pytest.raises(ValueError, match="calls"):
        profile_shares(lambda: a @ a, {"mm": ["mm"]}, calls=0)
    with pytest.raises(TypeError, match="callable"):
        profile_shares(a, {"mm": ["mm"]})


def test_profiling_prints_nothing(capfd):
    cpu_peak_memory(lambda: torch.empty(10))
    aten_ops(lambda: torch.empty(10))
    op_self_ms(lambda: torch.empty(10))
    out, err = capfd.readouterr()
    assert out == "" and err == ""


# ------------------------------------------------------------------ second edition additions
def test_time_fn_runs_with_torchs_own_threads():
    """torch.utils.benchmark.Timer defaults to one thread; time_fn must time what PyTorch really
    uses, so inside the timed function the thread count is the one outside it."""
    outside = torch.get_num_threads()
    seen = []
    time_fn(lambda: seen.append(torch.get_num_threads()), min_run_time=0.01)
    assert seen and set(seen) == {outside}
    assert torch.get_num_threads() == outside  # and it is left as it was


def test_machine_info_reports_both_thread_counts():
    info = machine_info("cpu")
    assert info["torch threads (used by every timing)"] == str(torch.get_num_threads())
    assert info["NumPy BLAS threads"] == str(numpy_threads())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sdpa_backends_per_dtype(dtype):
    found = sdpa_backends("cpu", dtype)
    assert list(found) == ["flash", "mem_efficient", "cudnn", "math"]
    assert found["math"]
    assert not found["mem_efficient"] and not found["cudnn"]  # CUDA-only kernels


def test_sdpa_kernel_used_names_the_kernel_that_ran():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 16, 8)

    def forced_math():
        with sdpa_kernel([SDPBackend.MATH]):
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    assert [b for b, _ in sdpa_kernel_used(forced_math)] == ["math"]
    assert sdpa_kernel_used(lambda: q @ q.transpose(-2, -1)) == []
    default = sdpa_kernel_used(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert len(default) == 1 and default[0][1].startswith("aten::_scaled_dot_product")


def test_sdpa_backend_times_only_the_usable_backends():
    q = torch.randn(1, 2, 32, 16)
    times = sdpa_backend_times(q, q, q, min_run_time=0.01)
    usable = [name for name, ok in sdpa_backends("cpu").items() if ok]
    assert list(times) == usable
    assert all(t > 0 for t in times.values())


def test_sdpa_backend_calls_force_each_usable_backend():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 32, 16, generator=gen) for _ in range(3))
    calls = sdpa_backend_calls(q, k, v, causal=True)
    assert list(calls) == [name for name, ok in sdpa_backends("cpu").items() if ok]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    for name, call in calls.items():
        ran = [backend for backend, _ in sdpa_kernel_used(call)]
        assert ran == [name]  # the profiler sees the forced backend, not the default one
        torch.testing.assert_close(call(), expected, atol=1e-5, rtol=1e-5)


def test_best_times_ms_is_in_milliseconds_and_picks_the_clock(monkeypatch):
    times = best_times_ms({"sleep": lambda: time.sleep(0.003), "work": lambda: sum(range(20_000))},
                          "cpu", rounds=2, min_run_time=0.02)
    assert set(times) == {"sleep", "work"}
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # one thread: CPU time, which does not count a sleep
        one = best_times_ms({"sleep": lambda: time.sleep(0.003)}, "cpu", rounds=1, min_run_time=0.02)
        torch.set_num_threads(2)  # several threads: wall time, which does
        two = best_times_ms({"sleep": lambda: time.sleep(0.003)}, "cpu", rounds=1, min_run_time=0.02)
    finally:
        torch.set_num_threads(threads)
    assert one["sleep"] < 0.3  # a 3 ms sleep costs almost no CPU time
    assert 2.9 < two["sleep"] < 30  # 3 ms of wall time, in milliseconds


def test_timing_ways_ms_times_a_known_wall_time_three_ways():
    times = timing_ways_ms(lambda: time.sleep(0.003), "cpu", rounds=1, min_run_time=0.02)
    assert list(times) == ["bare clock", "Timer, 1 thread", "time_fn"]
    assert all(2.9 < ms < 30 for ms in times.values())  # a 3 ms sleep is 3 ms of wall time each way
    with pytest.raises(ValueError, match="rounds must be a positive integer"):
        timing_ways_ms(lambda: None, rounds=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator: Linux only")
def test_keep_freed_memory_stops_the_page_faults_of_large_temporaries():
    """In a fresh process, after keep_freed_memory() and a few calls to grow the heap, a call that
    makes four 8 MiB temporaries (three alive at once, like naive attention at T = 512) reuses its
    pages: (almost) no fault per call in a batch of five, against thousands before it,
    where a single fresh 8 MiB block alone has 2,048 pages of 4 KiB. Run in a subprocess, so that
    this process's allocator is left as it was."""
    code = ("import torch; from shared.benchmark import keep_freed_memory, minor_page_faults\n"
            "def call():\n"
            "    a = torch.ones(2**21); b = a * 2; del a; c = b + 1; d = c * 3; del b\n"
            "    return d.sum()\n"
            "before = minor_page_faults(call, calls=5)\n"
            "kept = keep_freed_memory(); minor_page_faults(call, calls=5)  # the heap grows once\n"
            "print(kept, before, *(minor_page_faults(call, calls=5) for _ in range(3)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "True"  # glibc took both settings
    assert float(out[1]) > 1000, out  # by default: freed blocks go back, each call faults afresh
    after = [float(x) for x in out[2:]]  # three batches of 5 calls
    assert min(after) < 64, out  # 2,048 pages per fresh 8 MiB block; reused pages fault not
    assert max(after) < 1024, out  # at worst a fresh block now and then (heap growth), not each call


def test_minor_page_faults_count_fresh_memory_only():
    pytest.importorskip("resource")  # Linux and macOS
    held = torch.zeros(2**22)  # 16 MiB owned once
    assert minor_page_faults(lambda: held.fill_(1.0)) < 4  # writing into owned pages: (almost) no fault
    fresh = minor_page_faults(lambda: torch.ones(2**24))  # 64 MiB fresh per call, touched
    assert fresh >= 16  # even with 2 MiB huge pages, 64 MiB is at least 32 of them
    with pytest.raises(ValueError, match="calls"):
        minor_page_faults(lambda: None, calls=0)


def test_attention_bytes_by_hand():
    # fused: Q, K, V and the output once: B*H*(2*T_q + 2*T_k)*d elements
    assert attention_bytes(1, 1, 2, 3, 4) == (2 * 2 + 2 * 3) * 4 * 4
    # unfused adds four passes over the T_q x T_k scores/weights
    assert attention_bytes(2, 3, 5, 5, 8, torch.float16, fused=False) == \
        2 * 3 * ((2 * 5 + 2 * 5) * 8 + 4 * 5 * 5) * 2
    # the roofline argument: fused intensity grows with T, unfused stays below head_dim / 4
    i_fused = attention_flops(1, 8, 4096, 4096, 64) / attention_bytes(1, 8, 4096, 4096, 64)
    i_unfused = attention_flops(1, 8, 4096, 4096, 64) / attention_bytes(1, 8, 4096, 4096, 64,
                                                                        fused=False)
    assert i_fused == pytest.approx(4096 / 4) and i_unfused < 64 / 4


def test_memory_bandwidth_is_a_plausible_rate():
    rate = memory_bandwidth("cpu", mib=4, min_run_time=0.01)
    assert 0.1 < rate < 10_000  # GB/s


def test_memory_budget_helpers():
    free = device_memory_bytes("cpu")
    assert free > 2**20
    assert fits_in_memory(1, "cpu") and not fits_in_memory(10 * free, "cpu")
    # three score-sized buffers and the output, as measured for naive attention
    assert naive_peak_bytes(1, 2, 128, 128, 16) == 3 * naive_score_bytes(1, 2, 128, 128) + 2 * 128 * 16 * 4
    gen = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(1, 2, 128, 16, generator=gen) for _ in range(3))
    from shared.modules import naive_attention
    measured = cpu_peak_memory(lambda: naive_attention(Q, K, V))
    assert measured <= naive_peak_bytes(1, 2, 128, 128, 16) <= 1.5 * measured


def test_is_out_of_memory():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8 GiB"))
    assert is_out_of_memory(RuntimeError("MPS backend out of memory (MPS allocated: 6 GB)"))
    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: "
                                         "can't allocate memory: you tried to allocate 8 GB"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))


def test_dtype_works_on_the_cpu():
    assert dtype_works("cpu", torch.float32) and dtype_works("cpu", torch.bfloat16)


def test_dtype_works_probes_the_shape_it_is_given(monkeypatch):
    """A kernel that fails only at larger sizes (as bfloat16 SDPA does on an AMX CPU limited to
    AVX2 kernels) is caught when the probe uses the real size, missed by a tiny probe."""
    import shared.benchmark as bm

    real = bm.F.scaled_dot_product_attention
    seen = []

    def fails_from_64_tokens(q, k, v, **kwargs):
        seen.append(tuple(q.shape))
        if q.dtype == torch.bfloat16 and q.shape[-2] >= 64:
            raise RuntimeError("pack_vnni2 is only supported when avx512 is supported")
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(bm.F, "scaled_dot_product_attention", fails_from_64_tokens)
    assert dtype_works("cpu", torch.bfloat16, shape=(1, 2, 16, 64))
    assert not dtype_works("cpu", torch.bfloat16, shape=(1, 8, 256, 64))
    assert not dtype_works("cpu", torch.bfloat16)  # the default probes a size the course uses
    assert dtype_works("cpu", torch.float32, shape=(1, 8, 256, 64))
    assert seen[:2] == [(1, 2, 16, 64), (1, 8, 256, 64)]


@pytest.mark.parametrize("shape", [(8,), (1, 0, 4), (1, 2.0, 4), (True, 4)])
def test_dtype_works_rejects_a_bad_shape(shape):
    with pytest.raises(ValueError, match="shape must be"):
        dtype_works("cpu", torch.float32, shape=shape)


def test_simulated_gpu_is_asynchronous():
    gpu = SimulatedGPU(kernel_s=2e-3, first_s=50e-3, launch_s=5e-6)
    t0 = gpu.clock()
    gpu.launch()
    gpu.launch()
    assert gpu.clock() - t0 == pytest.approx(2 * 5e-6)  # launches return at once
    assert gpu.busy
    gpu.synchronize()
    assert not gpu.busy
    assert gpu.clock() - t0 == pytest.approx(5e-6 + 50e-3 + 2e-3)  # first kernel, then one more
    assert [e[0] for e in gpu.log] == ["clock", "launch", "launch", "clock", "sync", "clock"]
    assert gpu.log[3][2] is True and gpu.log[5][2] is False  # busy at the read, then not
    assert gpu.synchronized_clock() == gpu.now



def test_simulated_gpu_neighbour_slows_exactly_the_named_kernels():
    """By hand: kernel 0 takes first_s, kernels 2 and 3 (of 0-4) take 3 x 2 ms, the rest 2 ms."""
    gpu = SimulatedGPU(kernel_s=2e-3, first_s=50e-3, launch_s=5e-6, slow_calls=range(2, 4), slow_x=3.0)
    for _ in range(5):
        gpu.launch()
    gpu.synchronize()
    assert gpu.clock() == pytest.approx(5e-6 + 50e-3 + 2e-3 + 2 * 6e-3 + 2e-3, rel=1e-12)
    with pytest.raises(ValueError, match="slow_x must be a factor > 0"):
        SimulatedGPU(slow_x=0)


def test_simulated_gpu_sync_cost_is_paid_once_per_synchronize_after_the_queue_drains():
    """By hand: 20 us kernels, 5 us launches, 10 us per synchronize(): a block of 4 calls between
    two synchronised readings spans 5 + 4 x 20 + 10 us; a second synchronize() adds 10 us more,
    and the default sync_s = 0 leaves section 3's numbers as they were."""
    gpu = SimulatedGPU(kernel_s=20e-6, first_s=20e-6, launch_s=5e-6, sync_s=10e-6)
    gpu.synchronize()
    t0 = gpu.clock()
    assert t0 == pytest.approx(10e-6)  # an empty queue still costs the host its 10 us
    for _ in range(4):
        gpu.launch()
    gpu.synchronize()
    assert gpu.clock() - t0 == pytest.approx(5e-6 + 4 * 20e-6 + 10e-6, rel=1e-12)
    gpu.synchronize()
    assert gpu.clock() - t0 == pytest.approx(5e-6 + 4 * 20e-6 + 2 * 10e-6, rel=1e-12)
    plain = SimulatedGPU(kernel_s=20e-6, first_s=20e-6, launch_s=5e-6)
    for _ in range(4):
        plain.launch()
    plain.synchronize()
    assert plain.sync_s == 0 and plain.clock() == pytest.approx(5e-6 + 4 * 20e-6, rel=1e-12)
    with pytest.raises(ValueError, match="sync_s must be a time >= 0"):
        SimulatedGPU(sync_s=-1e-6)

def test_bench_smoke_run_writes_markdown_and_survives_oom(tmp_path, monkeypatch):
    """tools/bench.py end to end at tiny sizes; a candidate that runs out of memory is reported
    as OOM (and not retried at longer lengths) instead of ending the run."""
    from tools import bench

    monkeypatch.setitem(bench.PLANS, "quick", bench.Plan((16, 32), 16, 1, 0.002, 1, 16))
    monkeypatch.setattr(bench, "memory_bandwidth", lambda device, mib=None, min_run_time=0.2: 10.0)
    monkeypatch.setattr(bench, "MATMUL_N", 128)
    real = bench.tiled_attention

    def tiled_that_runs_out(Q, *args, **kwargs):
        if Q.shape[-2] >= 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        return real(Q, *args, **kwargs)

    monkeypatch.setattr(bench, "tiled_attention", tiled_that_runs_out)
    out = tmp_path / "results.md"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "| 32 | no | tiled loop (eager) | OOM |" in text
    assert "| 32 | yes | tiled loop (eager) | OOM at T = 32 |" in text
    assert "| 16 | no | SDPA |" in text and "| 32 | no | SDPA |" in text
    assert f"num_threads = torch.get_num_threads()` = {torch.get_num_threads()}" in text
    assert "## SDPA backends" in text and "| float32 | yes | no | no | yes | flash |" in text


def test_operation_count_counts_computing_operators():
    a = torch.ones(3, 3)
    assert operation_count(lambda: a @ a) == 1  # one mm
    assert operation_count(lambda: (a + 1) * 2) == 2
    assert operation_count(lambda: a.t()[1:]) == 0  # views compute nothing
    assert operation_count(lambda: None) == 0
    from shared.flash import tiled_attention

    q = torch.randn(1, 1, 8, 2)
    one_tile = operation_count(lambda: tiled_attention(q, q, q, block_size=8))
    four_tiles = operation_count(lambda: tiled_attention(q, q, q, block_size=4))
    assert 10 <= (four_tiles - one_tile) / 3 <= 25  # about fifteen operations per extra tile


def test_course_device_overrides_the_choice(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert pick_device() == torch.device("cpu")
    monkeypatch.setenv("COURSE_DEVICE", "")
    assert pick_device() == torch.device("mps")  # what a Mac would choose


def test_course_device_names_what_is_wrong(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "gpu")
    with pytest.raises(ValueError, match="COURSE_DEVICE must be 'cpu', 'cuda' or 'mps'; got 'gpu'"):
        pick_device()
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="COURSE_DEVICE=cuda but torch sees no cuda device"):
        pick_device()


def test_operation_counts_names_each_operation():
    """By hand: a @ b is one mm, (x * 2).exp() one mul and one exp, a transpose (a view) and
    torch.empty (an allocation) nothing; the total equals operation_count's."""
    from shared.benchmark import operation_count, operation_counts

    a = torch.randn(3, 3)

    def fn():
        torch.empty(4)
        (a @ a.t() * 2).exp()

    counts = operation_counts(fn)
    assert counts == {"mm": 1, "mul": 1, "exp": 1}
    assert counts.total() == operation_count(fn) == 3
    with pytest.raises(TypeError):
        operation_counts(42)


def test_quiet_stderr_silences_file_descriptor_2_and_restores_it(capfd):
    from shared.benchmark import quiet_stderr

    with quiet_stderr():
        os.write(2, b"hidden C++ line\n")
    os.write(2, b"shown after\n")
    assert capfd.readouterr().err == "shown after\n"


def test_new_tensors_of_shape_counts_new_memory_only():
    x = torch.randn(2, 3, 4, 4)

    def chain():
        y = x / 2.0  # new (2, 3, 4, 4): counted
        y.mul_(3.0)  # in place: not counted
        z = y.transpose(-2, -1)  # a view: not counted
        w = torch.softmax(z, dim=-1)  # new: counted
        return w.sum(dim=-1)  # another shape: not counted

    assert new_tensors_of_shape(chain, (2, 3, 4, 4)) == ["div", "softmax"]
    assert new_tensors_of_shape(chain, (2, 3, 4)) == ["sum"]
    assert new_tensors_of_shape(lambda: x + 0, (1, 1)) == []


def test_new_tensors_of_shape_rejects_a_non_callable():
    with pytest.raises(TypeError):
        new_tensors_of_shape(torch.zeros(3), (3,))
