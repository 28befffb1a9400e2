"""DCT-MP's sign codec in C (compression/mp_sign_native.py) gives the PyTorch path's bytes and floats bit for bit: both
directions, one and two bits, random rounding, on odd widths, empty and strided inputs, zeros of both signs,
subnormals, float32's largest, NaN and inf; and it steps aside where it cannot run."""
import pytest
import torch

from neuroshard.compression import mp_sign, mp_sign_native, wire
from conftest import compiler_found
from neuroshard.core import native

NAME = "sign_codec"


@pytest.fixture(scope="module")
def kernels():
    k = mp_sign_native._kernels()
    if k is None and compiler_found():
        pytest.fail("the C sign codec did not compile with this machine's compiler")
    if k is None:
        pytest.skip("no C compiler here: the PyTorch path is the only one (covered by test_mp_sign's tests)")
    return k


def _inputs():
    g = torch.Generator().manual_seed(0)
    for rows, segments, blocks in ((384, [128] * 7, 3), (12, [3, 0, 16, 16, 5, 130], 3), (8, [88, 87, 200], 2),
                                   (4, [1], 1), (6, [9, 9, 9], 3), (4, [0, 0], 2)):
        w = sum(segments)
        for kind in ("gauss", "subnormal", "heavy", "specials", "huge", "sparse", "whole", "strided"):
            x = torch.randn(rows, w, generator=g)
            if kind == "subnormal":
                x = x * 1e-40
            elif kind == "heavy":
                x = x ** 5
            elif kind == "specials" and w:
                x[0], x[1] = 0.0, -0.0
                x[2, 0], x[3, -1] = float("nan"), float("inf")
            elif kind == "huge":
                x = x * 3e38
            elif kind == "sparse":
                x = torch.where(torch.rand(rows, w, generator=g) < 0.5, torch.zeros(()), x)
            elif kind == "whole":  # ties between |x| and the thresholds
                x = x.round()
            elif kind == "strided":
                x = torch.randn(rows, w + 5, generator=g)[:, 2:w + 2]
            yield rows, segments, blocks, x


def _both(monkeypatch, kernels, f):
    monkeypatch.setitem(native._loaded, NAME, None)
    torch_path = f()
    monkeypatch.setitem(native._loaded, NAME, kernels)
    return torch_path, f()


def _same_floats(a, b):
    return torch.equal(a.view(torch.int32), b.view(torch.int32))  # NaN's and zeros' signs too


def test_c_codec_gives_the_pytorch_bytes_and_floats(monkeypatch, kernels):
    n = 0
    for rows, segments, blocks, x in _inputs():
        for bits in (1, 2):
            a, b = _both(monkeypatch, kernels, lambda: mp_sign.sign_encode(x, segments, blocks=blocks, bits=bits))
            assert torch.equal(a, b), (segments, bits)
            da, db = _both(monkeypatch, kernels, lambda: mp_sign.sign_decode(a, segments, rows, blocks=blocks,
                                                                              bits=bits))
            assert _same_floats(da, db), (segments, bits)
        a, b = _both(monkeypatch, kernels,
                     lambda: mp_sign.sign_encode(x, segments, torch.Generator().manual_seed(3), blocks=blocks))
        assert torch.equal(a, b), segments
        n += 1
    assert n == 48


def test_two_bit_scale_is_the_least_squares_scale_summed_in_float64():
    """The forward scale, against a plain float64 computation of its definition (levels 1 and 3, the outer level
    where |x| >= the row's RMS): within a float32 rounding, on the C path and the PyTorch one alike."""
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(1)) * 10
    a = x.abs().double()
    outer = a * a >= (a * a).mean(1, keepdim=True)
    level = torch.where(outer, 3.0, 1.0)
    want = (a * level).sum(1) / (level * level).sum(1)
    got = mp_sign._two_bit_scale(x.abs())
    assert torch.allclose(got.double(), want, rtol=2e-7, atol=0)
    if mp_sign_native.loaded():
        assert torch.equal(mp_sign_native.two_bit_scales(x, 0, 1, 128, mp_sign.OUTER_LEVEL, wire.MIN_POSITIVE)[:, 0],
                           got)


def test_c_codec_steps_aside_where_it_cannot_run(monkeypatch):
    x = torch.randn(6, 16)
    assert not mp_sign_native.usable(x.double()) and not mp_sign_native.usable(x.to("meta")) \
        and not mp_sign_native.usable(x.t()) and not mp_sign_native.usable(x[0])
    for cc in ("/nonexistent/cc", "cc -x c++", 'cc "unclosed'):  # no compiler, mangled names, a CC shlex refuses
        assert native.compile_c(NAME, mp_sign_native.SOURCE, mp_sign_native.SIGNATURES, cc=cc) is None
    monkeypatch.setitem(native._loaded, NAME, None)  # the PyTorch path: the same round trip
    assert not mp_sign_native.loaded() and not mp_sign_native.usable(x)
    dec = mp_sign.sign_decode(mp_sign.sign_encode(x, [16], bits=1), [16], 6)
    assert torch.equal(torch.sign(dec), torch.sign(x))


def test_c_draws_are_pytorchs_draws_and_leave_the_generator_as_pytorch_does(kernels):
    for seed in (0, 1, 2 ** 40 + 7):
        for sizes in ([1], [623], [624], [625], [5, 1247, 3], [0, 7], [3 * 7 * 128 * 128]):
            mine, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            for g in (mine, theirs):
                torch.empty(seed % 701).uniform_(0, 2, generator=g)  # start anywhere in a block of 624 words
            want = [torch.empty(n).uniform_(0, 2, generator=theirs) for n in sizes]
            got = [torch.full((n,), 7.0) for n in sizes]
            assert mp_sign_native.uniform_0_2(got, mine)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (seed, sizes)
            assert torch.equal(mine.get_state(), theirs.get_state())
            assert torch.equal(torch.rand(9, generator=mine), torch.rand(9, generator=theirs))


def test_c_draws_step_aside_for_what_they_do_not_recognize(kernels):
    g = torch.Generator().manual_seed(0)
    before = g.get_state()
    out = torch.full((8,), 7.0)
    for outs in ([torch.empty(8, dtype=torch.float64)], [torch.empty(8, 2)[:, 0]], [torch.empty(8, device="meta")]):
        assert not mp_sign_native.uniform_0_2(outs, g)
    broken = before.clone()
    broken[16:24] = torch.tensor([600], dtype=torch.int64).view(torch.uint8)  # next word 600 with 1 left: fine
    g.set_state(broken)
    broken[8:12] = torch.tensor([624], dtype=torch.int32).view(torch.uint8)   # 624 left from word 600: beyond
    g.set_state(broken)                                                       # the state's end, which torch allows
    assert not mp_sign_native.uniform_0_2([out], g) and torch.equal(out, torch.full((8,), 7.0))
    g.set_state(before)
    assert mp_sign_native.uniform_0_2([out], g) and not torch.equal(out, torch.full((8,), 7.0))


def test_kernels_refuse_tensors_that_do_not_match_their_sizes(kernels):
    """They index raw memory: a mismatched call is refused in one line, never run."""
    def unpack(run, base, start=0, signs=mp_sign._SIGNS, table=mp_sign.CODE_SCALES):
        return mp_sign_native.unpack(run, 2, 16, 1, base, table, mp_sign.ZERO_CODE, signs, mp_sign._LEVELS,
                                  torch.empty(6, 32), start)

    x, f = torch.randn(6, 32), torch.float32
    scale, q, bad = torch.ones(2, 3, 2), torch.zeros(2, 3, 2, dtype=torch.uint8), torch.zeros(2, 3, 2, dtype=torch.bool)
    calls = [lambda: mp_sign_native.two_bit_scales(x, 8, 2, 16, 3.0, 1e-45),           # columns past the end
             lambda: mp_sign_native.two_bit_scales(x.double(), 0, 2, 16, 3.0, 1e-45),
             lambda: mp_sign_native.pack(x, 0, 4, 2, 16, 0, scale, q, bad, None, 3.0, 255),   # 6 rows in 4 blocks
             lambda: mp_sign_native.pack(x, 0, 2, 2, 16, 0, scale[:, :2], q, bad, None, 3.0, 255),
             lambda: mp_sign_native.pack(x, 0, 2, 2, 16, 2, scale, q, bad, torch.rand(2, 2, 3, 8), 3.0, 255),
             lambda: mp_sign_native.pack(x, 0, 2, 2, 16, 3, scale, q, bad, None, 3.0, 255),
             lambda: unpack(torch.zeros(6, 5, dtype=torch.uint8), torch.ones(2)),      # 5 of 6 bytes
             lambda: unpack(torch.zeros(6, 6, dtype=torch.uint8), torch.ones(2), start=8),  # past the end
             lambda: unpack(torch.zeros(6, 6, dtype=torch.uint8), torch.ones(2), signs=mp_sign._SIGNS[:128]),
             lambda: unpack(torch.zeros(6, 6, dtype=torch.uint8), torch.ones(3)),      # a base too many
             lambda: unpack(torch.zeros(6, 6, dtype=torch.uint8), torch.ones(2), table=mp_sign.CODE_SCALES[:200]),
             lambda: mp_sign_native.scale_codes(torch.ones(2, 3), True, mp_sign.CODE_SCALES, mp_sign.CODE_MIDPOINTS,
                                                255),
             lambda: mp_sign_native.scale_codes(torch.ones(2, 3, 2).double(), True, mp_sign.CODE_SCALES,
                                                mp_sign.CODE_MIDPOINTS, 255),
             lambda: mp_sign_native.scale_codes(torch.ones(2, 3, 2), True, mp_sign.CODE_SCALES, mp_sign.CODE_SCALES,
                                                255),                                  # midpoints one too many
             lambda: mp_sign_native.scale_codes(torch.ones(2, 3, 2), True, mp_sign.CODE_SCALES, mp_sign.CODE_MIDPOINTS,
                                                200)]                                  # codes past the zero code
    for call in calls:
        with pytest.raises(ValueError, match="^mp_sign_native: "):
            call()
    assert mp_sign_native.pack(x, 0, 2, 2, 16, 0, scale, q, bad, None, 3.0, 255).shape == (2, 3, 2 * 3)


def _scale_code_cases():
    g = torch.Generator().manual_seed(7)
    base = torch.tensor([1.0, 3e38, 1e-38, 7e-45, 0.37])
    on = base[:, None] * mp_sign.CODE_SCALES          # exactly a code's scale
    mid = base[:, None] * mp_sign.CODE_MIDPOINTS      # exactly between two codes
    near = torch.cat([on, mid, torch.nextafter(on, torch.zeros(())),
                      torch.nextafter(mid, torch.full((), float("inf")))], 1)
    m = near[:, torch.randperm(near.shape[1], generator=g)[:96]].T.reshape(96, 5)  # rows: samples; columns: shards
    m[0] = base                                       # each block's base itself
    m[1, 0], m[2, 1], m[3, 2], m[4, 3] = 0.0, -0.0, float("nan"), float("inf")
    m[5] = torch.tensor([1e-45, 1e-40, 5e-39, 0.0, 1e-30])  # under the last code's scale
    yield m.reshape(4, 24, 5)                         # 4 blocks of 24 samples
    yield torch.zeros(2, 3, 4)                        # nothing positive: base +0.0
    yield torch.full((1, 2, 3), float("nan"))         # nothing finite
    yield torch.rand(3, 0, 2, generator=g)            # no samples


def test_c_scale_codes_give_the_pytorch_bases_codes_and_scales(kernels):
    """Bases, codes (rounded up, and to the nearest), scales and flags: m exactly on a code's scale or on a midpoint
    between codes and one float either side, the base itself, zeros of both signs, NaN, inf, under the last code,
    subnormal bases, blocks of nothing positive, nothing finite, no samples."""
    for m in _scale_code_cases():
        r = m.shape[1]
        finite = m.isfinite()
        want_base = m.where(finite, 0.0).amax(dim=1, keepdim=True).add_(0.0) if r else m.new_zeros(m.shape[0], 1,
                                                                                                   m.shape[2])
        for round_up in (False, True):
            base, q, s, bad = mp_sign_native.scale_codes(m, round_up, mp_sign.CODE_SCALES, mp_sign.CODE_MIDPOINTS,
                                                         mp_sign.ZERO_CODE)
            want_q, want_s = mp_sign._scale_codes(m, want_base, round_up)
            assert _same_floats(base, want_base.reshape(base.shape)) and torch.equal(bad, ~finite)
            assert torch.equal(q, want_q) and _same_floats(s, want_s), (m.shape, round_up)
