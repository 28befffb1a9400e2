"""DCT-DP's threshold codec (compression/dp_threshold.py): the grouped threshold search and the sampled k-th
largest give exactly what the plain PyTorch operations give, the one-pass share rounds as the division then the
sum, and the encoding round-trips at four bytes an entry."""
import math

import pytest
import torch

from neuroshard.compression.dp_threshold import (GROUP_ROWS, MAX_DELTA, SAMPLE_STRIDE, add_mean_share, decode_into,
                                                 drift_cap, encode, keep_count, kth_largest, over_threshold,
                                                 payload_bytes)


def test_encoding_round_trips_and_costs_four_bytes_an_entry():
    g = torch.Generator().manual_seed(0)
    n = 400_000
    idx = torch.sort(torch.randperm(n, generator=g)[:300]).values
    idx = torch.unique(torch.cat([idx, torch.tensor([0, MAX_DELTA, 2 * MAX_DELTA + 7, n - 1])]))
    # a gap over 65,535 needs floor((gap - 1) / 65,535) fillers
    gaps = torch.diff(idx, prepend=torch.zeros(1, dtype=torch.int64))
    fillers = int(torch.clamp((gaps - 1) // MAX_DELTA, min=0).sum())
    vals = torch.randn(len(idx), generator=g)
    deltas, v16, real = encode(idx, vals)
    assert deltas.numel() == v16.numel() == len(idx) + fillers
    m = deltas.numel() + 5                                      # padded as for a rank with more entries
    payload = payload_bytes(deltas, v16, m)
    assert payload.numel() == 4 * m and payload.dtype == torch.uint8
    out = torch.zeros(n)
    decode_into(out, payload, m)
    assert torch.equal(torch.nonzero(out).squeeze(1), idx)
    assert torch.equal(out[idx], vals.half().float())
    assert keep_count(8433, 0.005) == 42 and drift_cap(42, 1.5) == 63 and drift_cap(1, 1.5) == 1


@pytest.mark.parametrize("n", [100, GROUP_ROWS * 1024 - 1, GROUP_ROWS * 1024, GROUP_ROWS * 4096 + 7, 1_000_003])
def test_grouped_threshold_search_finds_exactly_the_plain_one(n):
    """over_threshold (column maxima and minima first) returns the same sorted positions as
    (|g| >= tau).nonzero(), with ties at tau on both signs, zeros, a tail that does not fill a row,
    nothing or everything over tau, and NaNs."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    x[torch.randint(0, n, (n // 7,), generator=g)] = 0.0
    mag = x.abs()
    tau = float(mag.kthvalue(max(1, n - n // 200)).values)
    x[torch.randint(0, n, (5,), generator=g)] = tau       # ties
    x[torch.randint(0, n, (5,), generator=g)] = -tau
    x[-1] = -2 * tau                                        # the tail
    mag = x.abs()
    cases = [tau, 0.0, float(mag.max()) * 2, float(mag.max()), 1e-30]
    for t in cases:
        assert torch.equal(over_threshold(x, t), (mag >= t).nonzero().squeeze(1)), t
    x[n // 3] = float("nan")
    x[n // 5] = float("-inf")
    assert torch.equal(over_threshold(x, tau), (x.abs() >= tau).nonzero().squeeze(1))


@pytest.mark.parametrize("n", [100, GROUP_ROWS * 1024 * 16, 1_000_003])
def test_kth_largest_is_exactly_kthvalue_of_the_magnitudes(n):
    """kth_largest (a sampled bound, then the candidates over it) gives the k-th largest |g| as
    g.abs().kthvalue does: heavy ties, a sample that misses the largest entries (too few candidates),
    NaN (ranked largest by kthvalue), infinities, every k from 1 to all."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    x[torch.randint(0, n, (n // 3,), generator=g)] = 0.5   # ties across the bound
    x[torch.randint(0, n, (n // 3,), generator=g)] = -0.5
    for k in [1, 7, max(1, n // 200), n // 2, n]:
        assert kth_largest(x, k) == float(x.abs().kthvalue(n - k + 1).values), k
    y = torch.zeros(n)
    y[1::SAMPLE_STRIDE] = torch.rand(len(y[1::SAMPLE_STRIDE]), generator=g) + 1  # the sample sees only zeros
    z = torch.rand(n, generator=g)
    z[::SAMPLE_STRIDE] += 1                                 # the sample holds the largest: too few pass its bound
    for v in (y, z):
        for k in [1, max(1, n // 200)]:
            assert kth_largest(v, k) == float(v.abs().kthvalue(n - k + 1).values), k
    x[n // 2] = float("-inf")
    assert kth_largest(x, 1) == float("inf")
    x[n // 3] = float("nan")
    assert math.isnan(kth_largest(x, 1)) and kth_largest(x, 2) == float("inf")


@pytest.mark.parametrize("world", [2, 3, 4, 7])
def test_the_one_pass_share_rounds_as_divide_then_add(world):
    """The hook's g = residual + bucket / world in one pass equals the division then the sum, bit for bit, across
    magnitudes (large, subnormal, mixed), so error feedback delivers what the two steps deliver."""
    gen = torch.Generator().manual_seed(world)
    for scale_buf, scale_res in ((1.0, 0.1), (1e30, 1e-30), (1e-40, 1e-40), (1e-3, 1e3)):
        buf = torch.randn(50_000, generator=gen) * scale_buf
        res = torch.randn(50_000, generator=gen) * scale_res
        want = torch.div(buf, world)
        want += res
        got = add_mean_share(res, buf, world, out=torch.empty(50_000))
        assert torch.equal(got, want)
