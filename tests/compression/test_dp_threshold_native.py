"""DCT-DP's C kernels (compression/dp_threshold_native.py): the fused share and threshold scan gives PyTorch's
floats and positions bit for bit, finds more positions than it has room for by a second pass, may write over the
residual it adds, and steps aside (None) where it cannot run; the hook takes it between refreshes; the encoder and
decoder give the PyTorch path's bytes and floats."""
import pytest
import torch

from neuroshard.compression import dp_threshold, dp_threshold_native as ss
from neuroshard.compression.wire import MIN_POSITIVE
from conftest import compiler_found
from neuroshard.core import native
from neuroshard.training import dct


def _torch_path(buf, res, world, tau):
    g = torch.empty_like(buf)
    if res is None:
        torch.div(buf, world, out=g)
    else:
        dp_threshold.add_mean_share(res, buf, world, g)
    return g, dp_threshold.over_threshold(g, tau)


def _cases():
    gen = torch.Generator().manual_seed(0)
    for n in (1, 3, 4, 7, 1000, 300_001):
        buf = torch.randn(n, generator=gen) * torch.logspace(-44, 38, n) if n > 1 else torch.randn(1, generator=gen)
        res = torch.randn(n, generator=gen) * 1e-3
        if n > 20:  # NaN, inf, a signed zero, the smallest subnormal, near float32's largest
            buf[5], buf[6], buf[7], res[7], buf[8], buf[9] = float("nan"), float("inf"), -0.0, 0.0, 1e-45, -3.4e38
        yield n, buf, res


@pytest.mark.parametrize("world", [1, 3, 4])
def test_fused_pass_gives_pytorchs_floats_and_positions(world):
    if not ss.loaded():
        assert not compiler_found(), "the fused pass did not compile with this machine's compiler"
        pytest.skip("no C compiler or not x86-64 here: the PyTorch path is the only one")
    checked = 0
    for n, buf, res in _cases():
        for r in (None, res):
            ref_g, _ = _torch_path(buf, r, world, 1.0)
            finite = ref_g[ref_g.isfinite()].abs()
            for tau in (float(finite.median()) if finite.numel() else 1.0, MIN_POSITIVE, 1e30):
                want_g, want_idx = _torch_path(buf, r, world, tau)
                g = torch.full((n,), 7.0)
                idx = ss.share_select(buf, r, world, tau, g, n)
                assert torch.equal(g.view(torch.int32), want_g.view(torch.int32)), (n, world, tau)
                assert idx.dtype == torch.int64 and torch.equal(idx, want_idx), (n, world, tau)
                checked += 1
    assert checked == 6 * 2 * 3


def test_more_positions_than_room_are_found_by_a_second_pass():
    if not ss.loaded():
        pytest.skip("no C compiler or not x86-64 here")
    buf = torch.randn(10_000, generator=torch.Generator().manual_seed(1))
    buf[3] = float("nan")
    want = dp_threshold.over_threshold(buf / 2, 0.1)
    for cap in (5, 10_000):  # over 8,000 qualify: no room for them, then room
        g = torch.empty_like(buf)
        idx = ss.share_select(buf, None, 2, 0.1, g, cap)
        assert idx.numel() > 8000 and torch.equal(idx, want), cap
        assert torch.equal(g.view(torch.int32), (buf / 2).view(torch.int32))


def test_the_share_may_be_written_over_the_residual():
    if not ss.loaded():
        pytest.skip("no C compiler or not x86-64 here")
    for n, buf, res in _cases():
        want_g, want_idx = _torch_path(buf, res, 3, 1e-3)
        inplace = res.clone()
        idx = ss.share_select(buf, inplace, 3, 1e-3, inplace, n)
        assert torch.equal(inplace.view(torch.int32), want_g.view(torch.int32)) and torch.equal(idx, want_idx), n
        plain = res.clone()  # the PyTorch path in place: the same floats
        dp_threshold.add_mean_share(plain, buf, 3, out=plain)
        assert torch.equal(plain.view(torch.int32), want_g.view(torch.int32)), n


def test_it_steps_aside_where_it_cannot_run(monkeypatch):
    buf = torch.randn(64)
    g = torch.zeros(64)
    for args in ((buf.double(), None, g.double()), (buf[::2], None, g[:32]), (buf, torch.randn(63), g),
                 (buf, None, torch.zeros(64, dtype=torch.float64)), (buf.to("meta"), None, g.to("meta")),
                 (torch.zeros(0), None, torch.zeros(0))):
        assert ss.share_select(args[0], args[1], 2, 0.5, args[2], 8) is None
    assert torch.equal(g, torch.zeros(64))  # nothing written
    # no compiler: logged, None, and the hook's PyTorch path takes over (the same results)
    for cc in ("/nonexistent/cc", "cc -DNOT_C_AT_ALL=1 -x c++ -std=c89", 'cc "unclosed'):
        assert native.compile_c("dp_codec", ss.SOURCE, ss.SIGNATURES, cc=cc) is None
    if ss.loaded():  # CC may be a command line
        assert native.compile_c("dp_codec", ss.SOURCE, ss.SIGNATURES, cc="cc -O1") is not None
    monkeypatch.setitem(native._loaded, "dp_codec", None)
    assert ss.share_select(buf, None, 2, 0.5, g, 8) is None


@pytest.fixture
def one_rank_group(tmp_path):
    """A one-rank gloo process group (a file store in tmp_path), destroyed after the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class _Two(torch.nn.Module):
    """Two parameters whose gradients are the inputs: loss = <a, ga> + <b, gb>."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Parameter(torch.zeros(300_000)), torch.nn.Parameter(torch.zeros(40_003))

    def forward(self, ga, gb):
        return (self.a * ga).sum() + (self.b * gb).sum()


def test_the_hook_takes_the_fused_pass_between_refreshes_with_the_same_results(monkeypatch, one_rank_group):
    """DCT-DP's hook on a one-rank DistributedDataParallel (real GradBuckets; DDP's rebuild after the first
    iteration reorders the bucket's parameters, so the residual is carried into a new layout), with and without
    the fused pass: between refreshes the fused pass runs (no separate share stage is timed) and gives the same
    g, positions, encoding, residual and delivered gradients; each delivered gradient is the fp16 of g at the
    positions sent and zero elsewhere."""
    if not ss.loaded():
        pytest.skip("no C compiler or not x86-64 here")
    gen = torch.Generator().manual_seed(2)
    grads = [torch.randn(340_003, generator=gen) * (1 + i / 10) for i in range(4)]  # tau drifts, within room
    works = []

    class Recorded(dct._Bucket):
        def __init__(self, *args):
            super().__init__(*args)
            works.append(self)

    def run(fused: bool):
        monkeypatch.setattr(dct, "_Bucket", Recorded)
        if not fused:
            monkeypatch.setitem(native._loaded, "dp_codec", None)
        model = _Two()
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=100)
        state = dct.DCTState(keep=0.01, refresh=3, error_feedback=True, sync=True)
        ddp.register_comm_hook(state, dct.dct_hook)
        out = []
        for it, grad in enumerate(grads):
            works.clear()
            before = state.work["prepare"]
            model.zero_grad(set_to_none=True)
            ddp(grad[:300_000], grad[300_000:]).backward()
            assert len(works) == 1 and state.iteration == it + 1, (it, len(works))  # one bucket, the last
            w = works[0]
            delivered = torch.cat([p.grad.flatten() for p in w.params])  # in the bucket's order
            sent = torch.zeros(w.n)
            sent[w.idx] = w.vals[w.real].float()
            assert _same(delivered, sent) and w.idx.numel() > 0, it
            out.append((it, state.work["prepare"] > before, w.idx.clone(), w.deltas.clone(), w.vals.clone(),
                        w.w.res.clone(), delivered))
        monkeypatch.undo()
        return out

    fused, plain = run(True), run(False)
    for (it, timed_share, *got), (_, plain_share, *want) in zip(fused, plain):
        assert timed_share == (it % 3 == 0) and plain_share  # iterations 0 and 3 refresh tau: the PyTorch path
        for a, b in zip(got, want):
            assert torch.equal(a.view(torch.uint8) if a.is_floating_point() else a,
                               b.view(torch.uint8) if b.is_floating_point() else b), it


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_encoder_gives_the_pytorch_encoders_bytes():
    """Gaps (fillers across gaps over 65,535, a first position of 0), fp16 values (clamped, subnormal, ties to
    even on every fp16 boundary, signed zeros) and where the real entries lie: dp_threshold.encode's, bit for bit."""
    if not ss.loaded():
        pytest.skip("no C compiler or not x86-64 here")
    gen = torch.Generator().manual_seed(3)
    n = 1_000_000
    g = torch.randn(n, generator=gen) * torch.logspace(-12, 6, n)
    g[7], g[8], g[65543], g[n - 1] = 1e9, -float("inf"), -0.0, 65519.0
    cases = [torch.tensor([0, 7, 8, 65543, 65543 + 65535, 65543 + 2 * 65535 + 1, n - 1]),
             torch.sort(torch.randperm(n, generator=gen)[:5000]).values, torch.tensor([n - 1]),
             torch.zeros(0, dtype=torch.int64)]
    half = torch.arange(0, 0x7C00, dtype=torch.int32).to(torch.int16).view(torch.float16).double()
    mid = ((half[:-1] + half[1:]) / 2).float()  # exactly between two fp16 values: ties go to the even one
    edge = torch.cat([mid, torch.nextafter(mid, torch.tensor(0.0)), torch.nextafter(mid, torch.tensor(1e9)),
                      half.float()])
    edge = torch.cat([edge, -edge])
    for idx, x in [(i, g) for i in cases] + [(torch.arange(edge.numel()), edge)]:
        got, want = ss.encode(idx, x), dp_threshold.encode(idx, x[idx])
        assert all(_same(a, b) for a, b in zip(got, want)), idx[:8]
    deltas, _, _ = ss.encode(cases[0], g)
    assert deltas.numel() == 7 + 1 + 12  # gaps of 65,535 need no filler; 65,536 one; 803,385 twelve


def test_encoder_refuses_what_it_cannot_encode():
    """Positions that are not ascending positions of g, or tensors it does not take: None, nothing read."""
    if not ss.loaded():
        pytest.skip("no C compiler or not x86-64 here")
    g = torch.randn(100)
    for idx in (torch.tensor([3, 3]), torch.tensor([5, 4]), torch.tensor([-1]), torch.tensor([100]),
                torch.tensor([2 ** 40]), torch.tensor([3, 9], dtype=torch.int32), torch.tensor([1, 2, 3, 4])[::2]):
        assert ss.encode(idx, g) is None, idx
    for x in (g.double(), g[::2].contiguous().reshape(5, 10), g.to("meta")):
        assert ss.encode(torch.tensor([1, 2]), x) is None


def test_decoder_gives_the_pytorch_decoders_floats():
    """Four ranks' padded payloads (fillers, padding, overlapping positions), and every fp16 bit pattern (signed
    zeros, subnormals, inf, NaN payloads): zeroing and index_add_'s floats, bit for bit."""
    if not ss.loaded():
        pytest.skip("no C compiler or not x86-64 here")
    gen = torch.Generator().manual_seed(4)
    n = 300_000
    coded = []
    for r in range(4):
        g = torch.randn(n, generator=gen) * torch.logspace(-10, 5, n)
        idx = torch.sort(torch.randperm(n, generator=gen)[:2000 + 300 * r]).values
        idx[-1] = n - 1 if r == 2 else idx[-1]
        coded.append(dp_threshold.encode(torch.cat([torch.tensor([0]), idx[1:]]) if r == 1 else idx, g[idx])[:2])
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    coded.append((torch.ones(65536, dtype=torch.int32).to(torch.uint16), every))  # positions 1 .. 65536
    m = max(d.numel() for d, _ in coded)
    parts = [dp_threshold.payload_bytes(d, v, m) for d, v in coded]
    want, got = torch.full((n,), 5.0), torch.full((n,), 5.0)
    want.zero_()
    for p in parts:
        dp_threshold.decode_into(want, p, m)
    assert ss.decode(got, parts, m)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert ss.decode(got, [], m) and not got.any()  # no parts: zeros


def test_decoder_refuses_positions_past_the_bucket():
    if not ss.loaded():
        pytest.skip("no C compiler or not x86-64 here")
    out = torch.full((100,), 5.0)
    bad = dp_threshold.payload_bytes(torch.tensor([60, 39, 1], dtype=torch.int32).to(torch.uint16),
                            torch.ones(3, dtype=torch.float16), 3)  # positions 60, 99, 100
    with pytest.raises(ValueError, match="passes the bucket's 100 entries"):
        ss.decode(out, [dp_threshold.payload_bytes(torch.tensor([5], dtype=torch.int32).to(torch.uint16),
                                          torch.ones(1, dtype=torch.float16), 3)[:12], bad], 3)
    assert not out.any()  # left zeroed
    with pytest.raises(IndexError):  # as the PyTorch path refuses it
        dp_threshold.decode_into(torch.zeros(100), bad, 3)
    for parts, m, o in (([bad], 2, out), ([bad.view(torch.int8)], 3, out), ([bad[::2]], 3, out),
                        ([bad], 3, out.double()), ([bad], 3, out.reshape(10, 10)), ([bad], -1, out)):
        assert ss.decode(o, parts, m) is False


def test_the_dense_hook_takes_a_bare_comm_stats_and_runs_blocking(one_rank_group):
    """`dense_hook` with a bare `CommStats` (as its docstring offers) on a one-rank DDP: the gradients arrive
    unchanged (one rank: divided by 1) and the bytes and seconds of the all_reduce are counted."""
    from neuroshard.training.dlrm import CommStats

    model = _Two()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=100)
    stats = CommStats()
    ddp.register_comm_hook(stats, dct.dense_hook)
    ga, gb = torch.randn(300_000), torch.randn(40_003)
    ddp(ga, gb).backward()
    assert torch.equal(model.a.grad, ga) and torch.equal(model.b.grad, gb)
    assert stats.bytes["dp"] == 4 * 340_003 and stats.seconds["dp"] > 0, stats  # blocking: the seconds are timed
