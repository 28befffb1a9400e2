"""DCT-MP's sign codec (compression/mp_sign.py): bytes, bits and scales as the scopes `sign` and `sign2` define
them, every peer's piece decoded in place by the exchanges (played by hand here; tests/training/test_dct.py runs
them on gloo ranks), zeros, NaN and inf, and the random rounding's draws."""
import numpy as np
import pytest
import torch

from neuroshard.compression import mp_sign, wire

STEP = 2 ** (1 / 16)  # the scale codes: steps of 2^(1/16)


def test_peer_blocks_leave_out_the_own_block_and_take_a_rank_without_tables():
    """The sign scopes code only the blocks bound for other ranks, in rank order; a rank of width 0 (no tables)
    and a world of one send no bytes."""
    rows = torch.arange(3 * 2 * 4, dtype=torch.float32).reshape(3, 2, 4)
    got = mp_sign._peer_blocks(rows, 1, lambda x: x)
    assert torch.equal(got, torch.cat([rows[0], rows[2]]))
    empty = mp_sign._peer_blocks(torch.zeros(3, 2, 0), 2, lambda x: mp_sign.sign_encode(x, [], blocks=2, bits=2))
    assert empty.dtype == torch.uint8 and empty.numel() == 0
    assert mp_sign._peer_blocks(rows[:1], 0, lambda x: x).numel() == 0
    assert mp_sign._without([5, 6, 7], 1) == [5, 0, 7]


class _HandPlayedAllToAll:
    """`dist` for the sign exchanges of one process playing every rank: a first round records what each rank sends
    in each exchange, a second hands each rank what its peers sent it (their sends do not depend on it)."""

    def __init__(self):
        self.rank, self.exchange, self.sent = 0, "fw", {}

    def get_rank(self):
        return self.rank

    def all_to_all_single(self, out, inp, out_splits, in_splits):
        self.sent[self.rank, self.exchange] = (inp.clone(), list(in_splits))
        peers = [q for q in range(len(in_splits)) if q != self.rank]
        if all((q, self.exchange) in self.sent for q in peers):
            out.copy_(torch.cat([self.chunk(q, self.rank) for q in peers]))

    def chunk(self, q: int, r: int) -> torch.Tensor:
        """The bytes rank q sent rank r in the current exchange."""
        data, splits = self.sent[q, self.exchange]
        return data[sum(splits[:r]):sum(splits[:r + 1])]


@pytest.mark.parametrize("bits", [1, 2])
def test_sign_exchanges_decode_each_peer_in_place_on_four_ranks(monkeypatch, bits):
    """Four ranks, ranks 0, 2 and 3 alike and rank 1 not (so rank 1's peers form one group around its own piece):
    each rank's forward and backward exchange give every peer's piece as that peer's bytes decode alone, and its own
    piece exactly, in rank order."""
    segments = [[96, 8], [16], [96, 8], [96, 8]]
    widths, bn = [sum(s) for s in segments], 6
    starts = np.cumsum([0] + [bn * w for w in widths])
    fake = _HandPlayedAllToAll()
    monkeypatch.setattr(mp_sign, "dist", fake)
    gen = torch.Generator().manual_seed(5)
    pooled = [torch.randn(4 * bn, w, generator=gen) for w in widths]
    grads = [torch.randn(bn * sum(widths), generator=gen) for _ in widths]
    for exchange in ("fw", "bw"):
        fake.exchange = exchange
        for _ in range(2):  # record the sends, then exchange them
            got = []
            for r in range(4):
                fake.rank = r
                lay = mp_sign.SignLayout(widths, 4 * bn, segments, torch.Generator().manual_seed(r), fw_bits=bits)
                got.append(lay.forward_exchange(pooled[r])[0] if exchange == "fw" else
                           lay.backward_exchange(grads[r], None)[0])
        for r in range(4):
            for q in range(4):
                if exchange == "fw":
                    piece, own = got[r][starts[q]:starts[q + 1]].view(bn, widths[q]), pooled[r][r * bn:(r + 1) * bn]
                    want = None if q == r else mp_sign.sign_decode(fake.chunk(q, r), segments[q], bn, bits=bits)
                else:
                    piece, own = got[r][q * bn:(q + 1) * bn], grads[r][starts[r]:starts[r + 1]].view(bn, widths[r])
                    want = None if q == r else mp_sign.sign_decode(fake.chunk(q, r), segments[r], bn)
                assert torch.equal(piece, own) if q == r else torch.equal(piece.view(torch.int32),
                                                                           want.view(torch.int32)), (exchange, r, q)
                assert q == r or piece.abs().sum() > 0


def test_sign_decode_writes_each_block_into_the_tensor_given():
    """`out`: each block decoded into its own tensor (views around a gap here), as the whole decode gives it; tensors
    of the wrong shape, type or number are refused in one line."""
    gen = torch.Generator().manual_seed(6)
    segments, x = [96, 8, 8], torch.randn(9, 112, generator=gen)
    for bits in (1, 2):
        enc = mp_sign.sign_encode(x, segments, blocks=3, bits=bits)
        whole = mp_sign.sign_decode(enc, segments, 9, blocks=3, bits=bits)
        buf = torch.full((12, 112), 7.0)
        blocks = [buf[0:3], buf[6:9], buf[9:12]]
        assert mp_sign.sign_decode(enc, segments, 9, blocks=3, bits=bits, out=blocks) is None
        assert torch.equal(torch.cat(blocks), whole) and (buf[3:6] == 7.0).all()
        for bad in (blocks[:2], [buf[0:3], buf[3:6], buf[6:8]], [b.double() for b in blocks],
                    [buf[0:3, :111]] * 3):
            with pytest.raises(ValueError, match="out must be 3 tensor"):
                mp_sign.sign_decode(enc, segments, 9, blocks=3, bits=bits, out=bad)


def test_scale_codes_meet_their_definition():
    """Rounded up: the code whose scale is the smallest one >= m (the next code's is under m); to the nearest: m lies
    between the midpoints around its code's scale. Zeros, NaN and inf get ZERO_CODE and scale 0. The table is
    2^(-q/16) rounded once to float32."""
    gen = torch.Generator().manual_seed(8)
    m = torch.rand(2, 500, 3, generator=gen) ** 6 * torch.tensor([1.0, 1e-30, 3e38])
    m[0, :4, 0] = torch.tensor([0.0, float("nan"), float("inf"), -0.0])
    finite = m.isfinite()
    base = m.where(finite, 0.0).amax(dim=1, keepdim=True)
    assert torch.equal(mp_sign.CODE_SCALES, (2.0 ** (-torch.arange(255, dtype=torch.float64) / 16)).float())
    up, s_up = mp_sign._scale_codes(m, base, round_up=True)
    nearest, s_near = mp_sign._scale_codes(m, base, round_up=False)
    special = ~((m > 0) & finite)
    assert (up[special] == mp_sign.ZERO_CODE).all() and (s_up[special] == 0).all() and (nearest[special] == 255).all()
    ok = ~special
    q, b, x = up[ok].long(), base.expand_as(m)[ok], m[ok]
    assert (s_up[ok] >= x).all() and torch.equal(s_up[ok], b * mp_sign.CODE_SCALES[q])
    assert ((q == 254) | (b * mp_sign.CODE_SCALES[(q + 1).clamp(max=254)] < x)).all()
    q = nearest[ok].long()
    assert ((q == 0) | (b * mp_sign.CODE_MIDPOINTS[(q - 1).clamp(min=0)] > x)).all()   # the midpoint above m
    assert ((q == 254) | (b * mp_sign.CODE_MIDPOINTS[q.clamp(max=253)] <= x)).all()   # and the one under it
    assert len(set(up[ok].tolist())) > 50 and (up[ok] == 254).any()  # many codes, and the last


def test_two_bit_codec_error_and_bytes():
    """Two bits forward: 2 * ceil(w / 8) + 1 bytes per sample and shard (33 against 512 at w = 128); on Gaussian
    rows the squared error is within 5% of the best 4-level quantizer's (0.1175 of the variance, Lloyd-Max),
    on uniform rows within 5% of the uniform grid's (1/16); a third of the sign's or less; zeros, NaN and inf
    rows as the sign codec handles them; random rounding is not offered at 2 bits."""
    assert [mp_sign.sign_bytes(w, 2) for w in (0, 1, 8, 9, 16, 128)] == [0, 3, 3, 5, 5, 33]
    # a second bit only where the round trip stays over 20x under dense: 88 columns (704 / 35 bytes) and up
    assert [mp_sign.shard_bits(w, 2) for w in (1, 16, 64, 80, 88, 128, 1024)] == [1, 1, 1, 1, 2, 2, 2]
    assert [mp_sign.shard_bits(w, 1) for w in (16, 128)] == [1, 1]
    assert mp_sign.sign_block_bytes([16, 0, 128], 256, bits=2) == 256 * (3 + 33) + 8
    g = torch.Generator().manual_seed(0)
    for x, best in ((torch.randn(512, 128, generator=g), 0.1175), (torch.rand(512, 128, generator=g) * 2 - 1, 1 / 16)):
        x = x * torch.logspace(-20, 20, 512, base=2).unsqueeze(1)  # per-row scales over 40 octaves
        err = {}
        for bits in (1, 2):
            enc = mp_sign.sign_encode(x, [128], blocks=4, bits=bits)
            assert enc.numel() == 4 * mp_sign.sign_block_bytes([128], 128, bits)
            dec = mp_sign.sign_decode(enc, [128], 512, blocks=4, bits=bits)
            near = x.abs().amax(1) >= x.abs().amax() * 2 ** -15  # within the scale codes' range of the block's base
            err[bits] = float(((dec - x)[near] ** 2 / (x[near] ** 2).mean(1, keepdim=True)).mean())
        assert err[2] <= best * 1.05 and err[2] <= err[1] / 3
    W = [128, 128]  # shards wide enough for 2 bits
    assert torch.equal(mp_sign.sign_decode(mp_sign.sign_encode(torch.zeros(2, 256), W, bits=2), W, 2, bits=2),
                       torch.zeros(2, 256))
    bad = torch.randn(6, 256)
    bad[1, 3], bad[4, 130] = float("nan"), float("inf")
    dec = mp_sign.sign_decode(mp_sign.sign_encode(bad, W, bits=2), W, 6, bits=2)
    assert dec[1, :128].isnan().all() and dec[4, 128:].isnan().all()  # the shards that held NaN / inf, whole
    assert dec[1, 128:].isfinite().all() and dec[4, :128].isfinite().all() and (dec[[0, 2, 3, 5]] != 0).all()
    big = torch.full((2, 128), 4.3e37) * torch.tensor([-1.0, 1.0] * 64)  # near float32's largest: no overflow
    dec = mp_sign.sign_decode(mp_sign.sign_encode(big, [128], bits=2), [128], 2, bits=2)
    assert torch.allclose(dec, big, rtol=1e-6)
    tiny = torch.zeros(1, 128)
    tiny[0, 3] = -1.4e-45  # a lone subnormal keeps its sign and a nonzero value
    assert torch.sign(mp_sign.sign_decode(mp_sign.sign_encode(tiny, [128], bits=2), [128], 1, bits=2))[0, 3] == -1
    with pytest.raises(ValueError, match="2 without random rounding"):
        mp_sign.sign_encode(bad, W, torch.Generator(), bits=2)
    for bits in (0, 3, "2"):
        with pytest.raises(ValueError, match="sign_encode codes 1 bit"):
            mp_sign.sign_encode(bad, W, bits=bits)
    with pytest.raises(ValueError, match="at 1 bit"):  # two-bit bytes read as one-bit ones are refused
        mp_sign.sign_decode(mp_sign.sign_encode(bad, W, bits=2), W, 6)
    # narrow shards get 1 bit under sign2: the same bytes as sign
    x = torch.randn(4, 24)
    assert torch.equal(mp_sign.sign_encode(x, [16, 8], bits=2), mp_sign.sign_encode(x, [16, 8]))


def test_sign_codecs_show_a_non_finite_sample_as_nan_and_keep_zeros_zero():
    """A sample shard holding NaN or inf arrives as NaN throughout (as a dense exchange would show the sender's
    divergence; it used to arrive as zeros or as finite values), in every codec: 1 and 2 bits forward, random
    rounding backward. Zero shards still arrive as exact zeros (random rounding's coin flips on them included),
    the other samples of the block as before, and the bytes keep their count."""
    W = [8, 128, 5]
    x = torch.randn(64, 141)
    x[3, 2], x[7, 20], x[9, 140], x[11, 0] = float("nan"), float("inf"), -float("inf"), float("nan")
    x[20:40] = 0.0
    x[5, :8] = -0.0
    hit = torch.zeros(64, 141, dtype=torch.bool)
    hit[3, :8] = hit[7, 8:136] = hit[9, 136:] = hit[11, :8] = True
    clean = x.masked_fill(hit, 1.0)  # the same rows with finite shards where the bad ones were
    for gen, bits in ((None, 1), (None, 2), (torch.Generator().manual_seed(0), 1)):
        enc = mp_sign.sign_encode(x, W, gen, blocks=4, bits=bits)
        assert enc.numel() == 4 * mp_sign.sign_block_bytes(W, 16, bits)
        dec = mp_sign.sign_decode(enc, W, 64, blocks=4, bits=bits)
        assert dec[hit].isnan().all() and dec[~hit].isfinite().all()
        assert torch.equal(dec[20:40], torch.zeros(20, 141)) and torch.equal(dec[5, :8], torch.zeros(8))
        if gen is None:  # samples in blocks without a bad one are coded exactly as without them
            ref = mp_sign.sign_decode(mp_sign.sign_encode(clean, W, blocks=4, bits=bits), W, 64, blocks=4, bits=bits)
            assert torch.equal(dec[16:], ref[16:])


def test_sign_codec_round_trip_bytes_and_unbiased_rounding():
    x = torch.tensor([[0.5, -1.5, 0.0, 2.0, -1.0, 3.0, 1e-30, -1e-30, 4.0, 5.0]])
    enc = mp_sign.sign_encode(x, [9, 1])
    assert enc.dtype == torch.uint8 and enc.shape == (2 * 4 + (2 + 1) + (1 + 1),)  # bases, then the sample
    assert [mp_sign.sign_bytes(w) for w in (0, 1, 8, 9, 16, 128)] == [0, 2, 2, 3, 3, 17]
    assert mp_sign.sign_block_bytes([16, 0, 128], 256) == 256 * 20 + 8
    s = x[0, :9].abs().mean(dtype=torch.float64).float().item()  # one sample: its scales are the bases, exact
    want = torch.tensor([[s, -s, s, s, -s, s, s, -s, s, 5.0]])
    assert torch.equal(mp_sign.sign_decode(enc, [9, 1], 1), want)
    assert torch.equal(mp_sign.sign_decode(mp_sign.sign_encode(torch.zeros(2, 4), [4]), [4], 2), torch.zeros(2, 4))
    # samples 2^-60 to 2^40 of one block: every scale within half a code step of its mean |x|, or 0 beyond
    # 2^-15.9 of the block's largest (the last code)
    y = torch.randn(101, 8) * torch.logspace(-60, 40, 101, base=2).unsqueeze(1)
    dec = mp_sign.sign_decode(mp_sign.sign_encode(y, [8]), [8], 101).abs()[:, 0]
    mean = y.abs().mean(1)
    near = mean >= mean.max() * 2 ** -15.5
    assert ((dec[near] / mean[near] - 1).abs() <= STEP ** 0.5 - 1 + 1e-6).all()
    assert (dec[~near] <= mean.max() * 2 ** -15.5).all() and near.sum() > 10 and (~near).sum() > 10
    # random rounding: every entry +-M (M >= max |x|), and the mean over draws is x
    gen = torch.Generator().manual_seed(1)
    rows = x.repeat(40_000, 1) * 1e-30   # a gradient's size: far below fp16's range, held by the fp32 base
    dec = mp_sign.sign_decode(mp_sign.sign_encode(rows, [9, 1], gen), [9, 1], 40_000)
    assert mp_sign.sign_encode(rows[:1], [9, 1], gen).shape == enc.shape
    m = dec[0, :9].abs().max()
    assert (dec[:, :9].abs() == m).all() and m >= 4e-30 and (dec[:, 9].abs() == dec[0, 9].abs()).all()
    assert dec[0, 9].abs() >= 5e-30
    assert torch.allclose(dec.double().mean(0), rows[0].double(), rtol=0, atol=4e-30 * 4 / 40_000 ** 0.5)
    assert torch.equal(mp_sign.sign_decode(mp_sign.sign_encode(torch.zeros(2, 4), [4], gen), [4], 2), torch.zeros(2, 4))
    z = torch.randn(64, 12) * torch.logspace(-12, 3, 64).unsqueeze(1)  # M >= max |x| on every sample
    dz = mp_sign.sign_decode(mp_sign.sign_encode(z, [12], gen), [12], 64)
    assert (dz.abs()[:, 0] >= z.abs().amax(1)).all()
    with pytest.raises(ValueError, match="do not split into 3 blocks"):
        mp_sign.sign_encode(torch.zeros(4, 4), [4], blocks=3)
    # a sample gone NaN or inf decodes as NaN in that shard, and leaves the others' scales alone
    bad = torch.randn(6, 16)
    bad[1, 3], bad[4, 0] = float("nan"), float("inf")
    for g in (None, torch.Generator().manual_seed(0)):
        dec = mp_sign.sign_decode(mp_sign.sign_encode(bad, [8, 8], g), [8, 8], 6)
        assert dec[1, :8].isnan().all() and dec[4, :8].isnan().all() and (dec[[0, 2, 3, 5]] != 0).all()
        assert dec[:, 8:].isfinite().all() and dec[[0, 2, 3, 5], :8].isfinite().all()
    assert mp_sign.sign_decode(mp_sign.sign_encode(torch.zeros(0, 16), [8, 8]), [8, 8], 0).shape == (0, 16)
    # near float32's largest and among subnormals, every finite sign and scale arrives
    big = torch.full((2, 8), 4.3e37) * torch.tensor([-1.0, 1.0] * 4)
    assert torch.equal(mp_sign.sign_decode(mp_sign.sign_encode(big, [8]), [8], 2), big)
    tiny = torch.zeros(1, 8)
    tiny[0, 3] = -1.4e-45
    assert (torch.sign(mp_sign.sign_decode(mp_sign.sign_encode(tiny, [8]), [8], 1))[0, 3]) == -1
    # what does not fit the format is refused in one line, not misread
    enc = mp_sign.sign_encode(bad, [8, 8])
    for args in ((torch.cat([enc, enc]), [8, 8], 6), (enc[:-1], [8, 8], 6), (enc.float(), [8, 8], 6),
                 (enc, [8, 8], 6, 4)):
        with pytest.raises(ValueError, match="sign_decode"):
            mp_sign.sign_decode(*args)
    for x_, seg in ((torch.zeros(2, 12), [4, 4]), (torch.zeros(2, 8), [12, -4]), (torch.zeros(8), [8]),
                    (torch.zeros(2, 8, dtype=torch.int64), [8])):
        with pytest.raises(ValueError, match="sign_encode takes"):
            mp_sign.sign_encode(x_, seg)


def test_sign_codec_packs_bits_least_significant_first():
    """The wire's bit order, pinned against a loop: entry i of a shard is bit i % 8 of byte i // 8 (sign plane,
    then on a 2-bit shard the magnitude plane, then the scale code); any faster packing must send these bytes."""
    g = torch.Generator().manual_seed(3)
    sign = torch.rand(1, 106, generator=g) < 0.5
    outer = torch.rand(1, 106, generator=g) < 0.3
    x = torch.where(sign, 1.0, -1.0) * torch.where(outer, 3.0, 1.0)  # levels +-1 and +-3: the 2-bit scale is 1

    def packed(bits):
        bits = bits.tolist() + [False] * (-len(bits) % 8)
        return [sum(int(b) << i for i, b in enumerate(bits[j:j + 8])) for j in range(0, len(bits), 8)]

    for bits in (1, 2):
        enc = mp_sign.sign_encode(x, [10, 96], bits=bits).tolist()
        assert enc[8:10] == packed(sign[0, :10])  # after the two shards' fp32 bases
        assert enc[11:23] == packed(sign[0, 10:])
        if bits == 2:
            assert enc[23:35] == packed(outer[0, 10:]) and enc[35] == 0  # scale code 0: the base itself
        want = x[:, 10:] if bits == 2 else torch.where(sign[:, 10:], 1.0, -1.0) * x[0, 10:].abs().mean()
        dec = mp_sign.sign_decode(torch.tensor(enc, dtype=torch.uint8), [10, 96], 1, bits=bits)
        assert torch.allclose(dec[:, 10:], want, rtol=1e-6, atol=0)


def test_random_rounding_sets_each_bit_by_its_own_draw():
    """Random rounding's wire, pinned against a loop: the generator's draws on [0, 1) are taken block by block,
    then shard by shard, [rows of the block, shard width] each, in order; an entry's sign bit is set where its
    draw is under (1 + x / M) / 2, M its sample shard's decoded scale. Any faster drawing or comparing must send
    these bits."""
    segments, blocks, rows = [4, 4, 3, 9], 2, 3  # a run of two 4-wide shards, then two shards of their own
    x = torch.randn(blocks * rows, sum(segments), generator=torch.Generator().manual_seed(8))
    x[4, 8:11] = 0  # a shard of zeros: scale 0, P = 1/2 on every entry, first bit set
    dec = mp_sign.sign_decode(mp_sign.sign_encode(x, segments, torch.Generator().manual_seed(4), blocks=blocks),
                              segments, blocks * rows, blocks=blocks)
    ref, checked = torch.Generator().manual_seed(4), 0
    for b in range(blocks):
        for a, w in zip([0, 4, 8, 11], segments):
            u = torch.empty(rows, w).uniform_(0, 1, generator=ref)
            xs, got = x[b * rows:(b + 1) * rows, a:a + w], dec[b * rows:(b + 1) * rows, a:a + w]
            m = got.abs()[:, :1]
            p = torch.where(m > 0, (xs / torch.where(m > 0, m, 1.0) + 1) / 2, 0.5)
            want = u < p
            if (m == 0).any():  # a zero shard decodes as zeros whatever its bits; its first bit is set
                assert b == 1 and a == 8 and torch.equal(got[1], torch.zeros(w))
                want, got = want[[0, 2]], got[[0, 2]]
            assert torch.equal(got > 0, want), (b, a)
            checked += want.numel()
    assert checked == blocks * rows * sum(segments) - 3


def test_sign_codec_tables_go_to_a_device_once():
    """The codec's constant tables are copied to another device once and then reused (on a GPU, not a copy and
    a wait every step); on their own device they are used as they are. The meta device stands in for a GPU."""
    cpu = torch.device("cpu")
    assert wire.on_device(mp_sign._SIGNS, cpu) is mp_sign._SIGNS
    meta = torch.device("meta")
    first = wire.on_device(mp_sign._SIGNS, meta)
    assert first.device == meta and first.shape == mp_sign._SIGNS.shape
    assert wire.on_device(mp_sign._SIGNS, meta) is first and wire.on_device(mp_sign._LEVELS, meta) is not first


def test_sign_codec_unpacks_by_shifting_as_by_table():
    """The unpacking a GPU takes (shift and mask) gives the CPU's table lookup's floats for every byte and for a
    width that ends inside a byte, for both tables."""
    b = torch.arange(256, dtype=torch.uint8).reshape(4, 32, 2)
    for table in (mp_sign._SIGNS, mp_sign._LEVELS):
        for w in (16, 13):
            want = mp_sign._unpack(table, b, w)
            got = mp_sign._unpack_shifted(table, b, w)
            assert got.dtype == want.dtype and torch.equal(got, want)
    assert mp_sign._unpack(mp_sign._SIGNS, b[:1, :1], 8).tolist() == [[[-1.0] * 8]]


def test_sign_codec_codes_a_run_of_equal_widths_as_each_segment_alone():
    """The codec handles consecutive segments of one width as one run (mp_sign._equal_width_runs): the codes,
    the random draws and the decoded values are those of coding each segment by itself, in order, and blocks
    coded together are those coded one by one, random draws included."""
    segments = [8, 8, 5, 5, 5, 0, 12, 1, 12, 12]
    x = torch.randn(6, sum(segments)) * torch.logspace(-8, 3, sum(segments))
    x[2, 16:21] = 0  # a segment of zeros: scale 0 in both directions
    starts = [sum(segments[:i]) for i in range(len(segments))]
    for seeded in (False, True):
        gens = [torch.Generator().manual_seed(5) if seeded else None for _ in range(2)]
        alone = [mp_sign.sign_decode(mp_sign.sign_encode(x[:, a:a + w], [w], gens[0]), [w], 6)
                 for a, w in zip(starts, segments)]
        whole = mp_sign.sign_encode(x, segments, gens[1])
        assert whole.numel() == mp_sign.sign_block_bytes(segments, 6)
        assert torch.equal(mp_sign.sign_decode(whole, segments, 6), torch.cat(alone, dim=1))
        if seeded:
            assert torch.equal(torch.rand(4, generator=gens[0]), torch.rand(4, generator=gens[1]))
        three = mp_sign.sign_encode(x, segments, gens[0], blocks=3)  # random draws too run block by block
        one_by_one = torch.cat([mp_sign.sign_encode(x[2 * i:2 * i + 2], segments, gens[1]) for i in range(3)])
        assert torch.equal(three, one_by_one)
        if not seeded:
            assert torch.equal(mp_sign.sign_decode(three, segments, 6, blocks=3),
                               torch.cat([mp_sign.sign_decode(one_by_one[i * len(three) // 3:(i + 1) * len(three) // 3],
                                                              segments, 2) for i in range(3)]))
        # a block at an odd byte offset, as an exchange hands a rank's piece to the decoder
        padded = torch.cat([torch.zeros(1, dtype=torch.uint8), whole])
        assert torch.equal(mp_sign.sign_decode(padded[1:], segments, 6), mp_sign.sign_decode(whole, segments, 6))
