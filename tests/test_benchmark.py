"""shared.benchmark: FLOP and byte counts by hand, timers against a known sleep, memory against
allocations of known size."""

from __future__ import annotations

import time

import pytest
import torch

from shared.benchmark import (
    aten_ops,
    attention_flops,
    cpu_peak_memory,
    gflops,
    interleaved_medians,
    machine_info,
    naive_score_bytes,
    peak_memory,
    pick_device,
    sdpa_backends,
    synchronize,
    time_fn,
)


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


def test_profiling_prints_nothing(capfd):
    cpu_peak_memory(lambda: torch.empty(10))
    aten_ops(lambda: torch.empty(10))
    out, err = capfd.readouterr()
    assert out == "" and err == ""
