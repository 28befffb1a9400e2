"""The DCT-DP hook on real gloo ranks with a multi-bucket model (DDP rebuilds its buckets after the
first iteration; static_graph and gradient_as_bucket_view too): bytes match the formula, the drift bound
holds."""
import pytest
import torch

from neuroshard.compression.dp_threshold import drift_cap
from neuroshard.hardware.launch import run_processes

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
