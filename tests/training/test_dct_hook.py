"""The DCT-DP hook on real gloo ranks with a multi-bucket model (DDP rebuilds its buckets after the
first iteration; static_graph and gradient_as_bucket_view too), and its encoding: bytes match the
formula, the drift bound holds."""
import math
import pytest
import torch

from neuroshard.hardware.launch import run_processes
from neuroshard.training.dct import (GROUP_ROWS, MAX_DELTA, SAMPLE_STRIDE, add_mean_share, decode_into, drift_cap, encode,
                                     keep_count, kth_largest, over_threshold, payload_bytes)

import dct_workers

# (error_feedback, static_graph, gradient_as_bucket_view, keep, growth, drift, refresh)
REBUILD = [(True, False, False), (False, False, False), (True, True, True), (False, True, False), (True, False, True)]
CONFIGS = [(*c, 0.005, 1.0, 1.5, 2) for c in REBUILD] + [
    (True, False, False, 1.0, 1.0, 1.5, 2),       # keep 1.0
    (False, False, False, 0.005, 10.0, 1000, 100),  # gradients grow 10x an iteration, no drift bound to speak of
    (False, False, False, 0.005, 10.0, 1.5, 100),   # ... with the default bound
    (False, False, False, 0.005, 0.0, 1.5, 2),      # all-zero gradients after the first iteration
    (True, False, False, 0.005, 0.0, 1.5, 100)]     # ... with error feedback: only the residual is left
ONE_BUCKET = len(CONFIGS)  # every parameter in one 100 MB bucket, which DDP's rebuild keeps but reorders
CONFIGS.append((True, False, False, 0.005, 1.0, 1.5, 2, False, 100))
# the same configs with the blocking hook (sync=True): the asynchronous one must match it bit for bit
TWINS = {c: len(CONFIGS) + i for i, c in enumerate((0, 2, 3, len(REBUILD) + 2, len(REBUILD) + 4))}
CONFIGS += [(*CONFIGS[c], True) for c in TWINS]


@pytest.fixture(scope="module")
def runs():
    got = {}

    def on_message(m):
        c, rank, *arrays, sent, refreshed, digests = m
        got[c, rank] = (*[[torch.from_numpy(a) for a in ts] for ts in arrays], sent, refreshed)
        got["digests", c, rank] = digests

    run_processes(dct_workers.multi_bucket, 2, (CONFIGS,), on_message, group_device="cpu")
    return got


@pytest.mark.parametrize("c", range(len(REBUILD)))
def test_multi_bucket_model_survives_the_bucket_rebuild(runs, c):
    error_feedback, drift = CONFIGS[c][0], CONFIGS[c][5]
    delivered, true, residual, sent, refreshed = runs[c, 0]
    n_params = sum(t.numel() for t in true)
    assert n_params > 1_800_000
    buckets = [len([s for s in sent if s[0] == it]) for it in range(4)]
    assert max(buckets) > 1 and len(set(buckets)) > 1       # several buckets, rebuilt along the way
    for it in range(4):
        rows = [s for s in sent if s[0] == it]
        assert sum(n for _, _, n, _, _ in rows) == n_params  # every parameter in exactly one bucket
        assert all(0 < cnt <= drift_cap(k, drift) for _, _, _, k, cnt in rows)
    assert (0, 0, "scheduled") in refreshed
    for d0, d1 in zip(runs[c, 0][0], runs[c, 1][0]):
        assert torch.equal(d0, d1)                         # every rank got the same gradient
    nonzero = sum(int((d != 0).sum()) for d in delivered)
    assert nonzero <= 2 * sum(drift_cap(k, drift) for _, _, _, k, _ in sent)  # 2 ranks
    if error_feedback:  # nothing is lost: delivered plus what the ranks still hold is the true sum
        for d, t, r in zip(delivered, true, residual):
            torch.testing.assert_close(d + r, t, rtol=1e-4, atol=1e-6)
        assert sum(float(r.abs().sum()) for r in residual) > 0
    else:
        assert all(float(r.abs().sum()) == 0 for r in residual)


@pytest.mark.parametrize("c", sorted(TWINS))
def test_async_hook_equals_the_sync_hook_bit_for_bit(runs, c):
    """Several buckets, rebuilt after the first iteration (static_graph and gradient_as_bucket_view
    included), a stale tau that drifts, residuals only: every iteration's delivered gradients, the
    residuals left and what each bucket sent are the same, bit for bit, with both hooks."""
    s = TWINS[c]
    buckets = [len([x for x in runs[c, 0][3] if x[0] == it]) for it in range(4)]
    assert max(buckets) > 1
    for rank in (0, 1):
        assert runs["digests", c, rank] == runs["digests", s, rank]
        a, b = runs[c, rank], runs[s, rank]
        assert a[3] == b[3] and a[4] == b[4]             # entries sent per bucket, refreshes
        for x, y in zip(a[2], b[2]):                     # residuals
            assert torch.equal(x, y)
    assert runs["digests", c, 0] == runs["digests", c, 1]  # and every rank got the same gradients


def test_a_rebuild_that_reorders_a_bucket_keeps_each_residual_with_its_parameter(runs):
    """One bucket holding every parameter: the rebuild keeps its set but changes its order. Residuals
    must follow their parameters (a version kept the bucket's flat residual in the old order, which
    added each residual to another parameter's gradient)."""
    delivered, true, residual, sent, refreshed = runs[ONE_BUCKET, 0]
    assert {b for _, b, *_ in sent} == {0}                  # one bucket throughout
    assert [r for _, _, r in refreshed].count("new bucket") == 0  # same set: the threshold carries over
    for d, t, r in zip(delivered, true, residual):
        torch.testing.assert_close(d + r, t, rtol=1e-4, atol=1e-6)


def test_keep_one_delivers_the_true_average(runs):
    delivered, true, residual, sent, _ = runs[len(REBUILD), 0]
    assert sent == []  # the dense all_reduce, not the encoding
    for d, t, r in zip(delivered, true, residual):
        torch.testing.assert_close(d, t, rtol=1e-5, atol=1e-7)
        assert float(r.abs().sum()) == 0


def test_drift_bound_holds_when_gradients_grow(runs):
    """Gradients 10x larger every iteration with a stale tau (refresh 100): without the bound far
    more than k entries go out; with it, never more than floor(drift * k) per bucket."""
    loose = runs[len(REBUILD) + 1, 0][3]
    assert max(cnt / k for it, _, _, k, cnt in loose if it > 0) > 5
    sent, refreshed = runs[len(REBUILD) + 2, 0][3:]
    assert all(cnt <= drift_cap(k, 1.5) for _, _, _, k, cnt in sent)
    assert any(r == "drift" for _, _, r in refreshed)
    assert all(r != "scheduled" or it == 0 for it, _, r in refreshed)


def test_all_zero_gradients_send_nothing_but_the_counts(runs):
    delivered, true, residual, sent, _ = runs[len(REBUILD) + 3, 0]
    assert all(cnt == 0 for it, _, _, _, cnt in sent if it > 0) and any(cnt > 0 for it, *_, cnt in sent if it == 0)
    assert sum(int((d != 0).sum()) for d in delivered) > 0  # what the first iteration delivered, nothing after


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


def test_nothing_is_lost_when_no_rank_has_an_entry_over_a_stale_tau(runs):
    """Zero gradients after the first iteration, error feedback on (refresh 100): what is left is the
    residual, all of it under the stale tau on every rank, so nothing goes out; it must stay the
    residual (a version dropped it whenever no rank sent an entry, so DCT-DP forgot every gradient under
    a stale tau until the next refresh)."""
    delivered, true, residual, sent, refreshed = runs[len(REBUILD) + 4, 0]
    fresh = {(it, b) for it, b, _ in refreshed}  # buckets DDP's rebuild made new get a fresh tau
    stale = [cnt for it, b, _, _, cnt in sent if it > 0 and (it, b) not in fresh]
    assert stale and all(cnt == 0 for cnt in stale)
    for d, t, r in zip(delivered, true, residual):
        torch.testing.assert_close(d + r, t, rtol=1e-4, atol=1e-7)
    later = sum(float(r.abs().sum()) for r in residual)
    assert later > 0.1 * sum(float((t - d).abs().sum()) for d, t in zip(delivered, true))


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


def test_frozen_adam_divides_by_the_floored_second_moment_of_the_warm_up():
    """--dp_adam_freeze_after: after dense Adam steps, FrozenAdam keeps Adam's first moment and bias
    correction but divides by the frozen bias-corrected second moment, floored at floor x its mean."""
    from neuroshard.training.dct import FrozenAdam

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(50))
    opt = torch.optim.Adam([p], lr=0.01)
    for _ in range(3):
        p.grad = torch.randn(50) * torch.linspace(0.001, 1, 50)
        opt.step()
    st = opt.state[p]
    v = st["exp_avg_sq"] / (1 - 0.999 ** 3)
    frozen = v.clamp(min=0.1 * float(v.mean()))
    assert (frozen > v).any()  # the floor binds for the small entries
    fa = FrozenAdam(opt, floor=0.1)
    m, w = st["exp_avg"].clone(), p.detach().clone()
    g = torch.randn(50)
    p.grad = g.clone()
    fa.step()
    m = 0.9 * m + 0.1 * g
    want = w - 0.01 / (1 - 0.9 ** 4) * m / (frozen.sqrt() + 1e-8)
    assert torch.allclose(p.detach(), want, rtol=1e-5, atol=1e-7)
    assert float(st["step"]) == 4 and torch.equal(st["exp_avg_sq"] / (1 - 0.999 ** 3), v)  # v untouched
    with pytest.raises(ValueError, match="weight decay"):
        FrozenAdam(torch.optim.Adam([p], weight_decay=0.1))


@pytest.mark.parametrize("world", [2, 3, 4, 7])
def test_the_one_pass_share_rounds_as_divide_then_add(world):
    """The hook's g = residual + bucket / world in one pass equals the division then the sum, bit for bit, across
    magnitudes (large, subnormal, mixed), so error feedback delivers what it did before the fusion."""
    gen = torch.Generator().manual_seed(world)
    for scale_buf, scale_res in ((1.0, 0.1), (1e30, 1e-30), (1e-40, 1e-40), (1e-3, 1e3)):
        buf = torch.randn(50_000, generator=gen) * scale_buf
        res = torch.randn(50_000, generator=gen) * scale_res
        want = torch.div(buf, world)
        want += res
        got = add_mean_share(res, buf, world, out=torch.empty(50_000))
        assert torch.equal(got, want)
