"""DCT-MP's wire format (compression/mp_wire.py): what one implementation encodes is what arrives.

The all-to-all is played by hand here (rank q receives rows q*B/N..(q+1)*B/N of every rank's send
buffer, in rank order), so encode -> exchange -> decode -> gather -> exchange -> scatter is checked
entry by entry without a process group; tests/training/test_dct.py runs the same code on gloo ranks.
"""
import math

import numpy as np
import pytest
import torch

from neuroshard.compression import mp_wire


def test_keep_count_and_index_type_follow_the_formula():
    assert [mp_wire.keep_count(w, 0.05) for w in (0, 1, 19, 20, 40, 41, 100)] == [0, 1, 1, 1, 2, 2, 5]
    assert mp_wire.keep_count(3, 1.0) == 3 and mp_wire.keep_count(3, 0.99) == 2
    assert [mp_wire.index_dtype(w) for w in (1, 256, 257, 32768, 32769)] == [
        torch.uint8, torch.uint8, torch.int16, torch.int16, torch.int32]
    assert mp_wire.entry_bytes([40, 256]) == 3 and mp_wire.entry_bytes([40, 300]) == 4
    assert mp_wire.entry_bytes([40, 40000]) == 6
    # --mp_scope table: each shard keeps max(1, ceil(keep * w))
    assert [mp_wire.keep_count(w, 0.05, "table") for w in (0, 1, 19, 20, 21, 128, 100)] == [0, 1, 1, 1, 2, 7, 5]
    assert mp_wire.keep_count(128, 0.0625, "table") == 8 and mp_wire.keep_count(3, 1.0, "table") == 3


def _segment_counts(widths, keep, segments):
    """K_r by the formula: floor per rank (scope rank), or the sum of ceil per shard (scope table)."""
    if segments is None:
        return [min(w, max(1, int(keep * w))) if w else 0 for w in widths]
    return [sum(min(w, max(1, math.ceil(keep * w))) for w in seg) for seg in segments]


def _exchange(sends, bn, world, split):
    """Rank q's receive buffer: its slice of every rank's flat send buffer, in rank order."""
    return [torch.cat([split(s, r, q) for r, s in enumerate(sends)]) for q in range(world)]


@pytest.mark.parametrize("widths,keep,segments", [
    ([40, 8, 24], 0.05, None), ([300, 12, 0], 0.1, None), ([64, 64, 64], 0.5, None),
    ([40, 8, 24], 0.05, [[16, 24], [8], [8, 16]]), ([300, 12, 0], 0.1, [[128, 128, 44], [12], []]),
    ([384, 128], 0.05, [[256, 128], [128]])])
def test_round_trip_is_the_top_k_entries_and_bytes_match_the_formula(widths, keep, segments):
    """Scope rank (segments None): one top-k per rank. Scope table: one per shard, indices within it."""
    world, bn = len(widths), 6
    B = world * bn
    g = torch.Generator().manual_seed(0)
    pooled = [torch.randn(B, w, generator=g) * 3 for w in widths]
    layout = mp_wire.WireLayout(widths, keep, B, segments)
    seg_widths = widths if segments is None else [w for seg in segments for w in seg]
    entry = 2 + mp_wire.index_dtype(max(seg_widths)).itemsize  # fp16 value + index within a segment
    if segments is not None and max(seg_widths) <= 256:
        assert entry == 3  # uint8 indices, even where a rank is wider than 256 columns
    assert layout.ks == _segment_counts(widths, keep, segments)
    enc = [mp_wire.encode(p, layout, r) for r, p in enumerate(pooled)]
    for r, (send, idx) in enumerate(enc):
        assert send.dtype == torch.uint8 and send.numel() == mp_wire.fw_send_bytes(widths, r, B, keep, segments)
        assert send.numel() == B * layout.ks[r] * entry
    e = layout.entry
    recvs = _exchange([s.reshape(-1) for s, _ in enc], bn, world,
                      lambda s, r, q: s[q * bn * layout.ks[r] * e: (q + 1) * bn * layout.ks[r] * e])
    grads_sent, recv_idx_of = [], []
    for q in range(world):
        dense, recv_idx = mp_wire.decode(recvs[q], layout)
        pos = 0
        for r, w in enumerate(widths):
            got = dense[pos: pos + bn * w].reshape(bn, w)
            pos += bn * w
            # expected: rank r's samples of rank q, only each sample's k_r largest |entries|, fp16-rounded
            rows = pooled[r][q * bn:(q + 1) * bn]
            want = torch.zeros(bn, w)
            start = 0
            for sw in (([w] if w else []) if segments is None else segments[r]):  # each segment's own top-k
                k = mp_wire.keep_count(sw, keep, "rank" if segments is None else "table")
                top = rows[:, start:start + sw].abs().topk(k, dim=1).indices + start
                want.scatter_(1, top, rows.gather(1, top).half().float())
                start += sw
            assert torch.equal(got, want)
        assert pos == dense.numel()
        # backward: every received entry's gradient goes back, fp32, nothing else
        grad = torch.arange(dense.numel(), dtype=torch.float32) + 0.5
        send = mp_wire.gather_grads(grad, layout, recv_idx)
        assert send.numel() * 4 == mp_wire.bw_send_bytes(widths, B, keep, segments) == bn * sum(layout.ks) * 4
        grads_sent.append(send)
        recv_idx_of.append(recv_idx)
    offsets = [np.cumsum([0] + [bn * k for k in layout.ks])[r] for r in range(world)]
    for r, w in enumerate(widths):
        k = layout.ks[r]
        out = torch.cat([grads_sent[q][offsets[r]: offsets[r] + bn * k] for q in range(world)])
        g_pooled = mp_wire.scatter_grads(out, enc[r][1], w)
        assert g_pooled.shape == (B, w)
        kept = torch.zeros(B, w, dtype=torch.bool)
        if k:
            kept.scatter_(1, enc[r][1], True)
        assert torch.all(g_pooled[~kept] == 0)
        for q in range(world):  # the gradient of entry (sample, col) is the grad value at its place on rank q
            base = sum(bn * widths[x] for x in range(r))
            dense_grad = (torch.arange(bn * w, dtype=torch.float32) + 0.5 + base).reshape(bn, w)
            block = g_pooled[q * bn:(q + 1) * bn]
            mask = kept[q * bn:(q + 1) * bn]
            assert torch.equal(block[mask], dense_grad[mask])


def test_values_beyond_fp16_are_clamped_not_infinite():
    layout = mp_wire.WireLayout([4, 4], 0.5, 2)
    send, idx = mp_wire.encode(torch.tensor([[1e6, -1e6, 0.0, 1.0], [0.0, 2.0, -3.0, 1e-3]]), layout, 0)
    dense, _ = mp_wire.decode(send[:1].reshape(-1), mp_wire.WireLayout([4], 0.5, 1))
    assert torch.equal(dense.reshape(4), torch.tensor([65504.0, -65504.0, 0.0, 0.0]))


def test_segments_must_add_up_to_the_ranks_widths():
    with pytest.raises(ValueError, match="do not add up"):
        mp_wire.WireLayout([40, 8], 0.05, 4, [[16, 16], [8]])


def test_one_sample_per_rank_decodes():
    """bn = 1 (a batch of one sample per rank): a one-row column slice of the received bytes has a row stride
    of the whole entry block (here 3 bytes: fp16 value + uint8 index), which a dtype view refuses unless the
    slice is made dense first."""
    layout = mp_wire.WireLayout([20], 0.05, 1)
    x = torch.zeros(1, 20)
    x[0, 7] = -2.5
    send, _ = mp_wire.encode(x, layout, 0)
    assert send.shape == (1, 3)
    dense, (idx,) = mp_wire.decode(send.reshape(-1), layout)
    assert torch.equal(dense, x.reshape(-1)) and idx.tolist() == [[7]]


def test_peer_blocks_leave_out_the_own_block_and_take_a_rank_without_tables():
    """The sign scopes code only the blocks bound for other ranks, in rank order; a rank of width 0 (no tables)
    and a world of one send no bytes."""
    rows = torch.arange(3 * 2 * 4, dtype=torch.float32).reshape(3, 2, 4)
    got = mp_wire._peer_blocks(rows, 1, lambda x: x)
    assert torch.equal(got, torch.cat([rows[0], rows[2]]))
    empty = mp_wire._peer_blocks(torch.zeros(3, 2, 0), 2, lambda x: mp_wire.sign_encode(x, [], blocks=2, bits=2))
    assert empty.dtype == torch.uint8 and empty.numel() == 0
    assert mp_wire._peer_blocks(rows[:1], 0, lambda x: x).numel() == 0
    assert mp_wire._without([5, 6, 7], 1) == [5, 0, 7]


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
    monkeypatch.setattr(mp_wire, "dist", fake)
    gen = torch.Generator().manual_seed(5)
    pooled = [torch.randn(4 * bn, w, generator=gen) for w in widths]
    grads = [torch.randn(bn * sum(widths), generator=gen) for _ in widths]
    for exchange in ("fw", "bw"):
        fake.exchange = exchange
        for _ in range(2):  # record the sends, then exchange them
            got = []
            for r in range(4):
                fake.rank = r
                lay = mp_wire.SignLayout(widths, 4 * bn, segments, torch.Generator().manual_seed(r), fw_bits=bits)
                got.append(lay.forward_exchange(pooled[r])[0] if exchange == "fw" else
                           lay.backward_exchange(grads[r], None)[0])
        for r in range(4):
            for q in range(4):
                if exchange == "fw":
                    piece, own = got[r][starts[q]:starts[q + 1]].view(bn, widths[q]), pooled[r][r * bn:(r + 1) * bn]
                    want = None if q == r else mp_wire.sign_decode(fake.chunk(q, r), segments[q], bn, bits=bits)
                else:
                    piece, own = got[r][q * bn:(q + 1) * bn], grads[r][starts[r]:starts[r + 1]].view(bn, widths[r])
                    want = None if q == r else mp_wire.sign_decode(fake.chunk(q, r), segments[r], bn)
                assert torch.equal(piece, own) if q == r else torch.equal(piece.view(torch.int32),
                                                                           want.view(torch.int32)), (exchange, r, q)
                assert q == r or piece.abs().sum() > 0


def test_sign_decode_writes_each_block_into_the_tensor_given():
    """`out`: each block decoded into its own tensor (views around a gap here), as the whole decode gives it; tensors
    of the wrong shape, type or number are refused in one line."""
    gen = torch.Generator().manual_seed(6)
    segments, x = [96, 8, 8], torch.randn(9, 112, generator=gen)
    for bits in (1, 2):
        enc = mp_wire.sign_encode(x, segments, blocks=3, bits=bits)
        whole = mp_wire.sign_decode(enc, segments, 9, blocks=3, bits=bits)
        buf = torch.full((12, 112), 7.0)
        blocks = [buf[0:3], buf[6:9], buf[9:12]]
        assert mp_wire.sign_decode(enc, segments, 9, blocks=3, bits=bits, out=blocks) is None
        assert torch.equal(torch.cat(blocks), whole) and (buf[3:6] == 7.0).all()
        for bad in (blocks[:2], [buf[0:3], buf[3:6], buf[6:8]], [b.double() for b in blocks],
                    [buf[0:3, :111]] * 3):
            with pytest.raises(ValueError, match="out must be 3 tensor"):
                mp_wire.sign_decode(enc, segments, 9, blocks=3, bits=bits, out=bad)


def test_scale_codes_meet_their_definition():
    """Rounded up: the code whose scale is the smallest one >= m (the next code's is under m); to the nearest: m lies
    between the midpoints around its code's scale. Zeros, NaN and inf get ZERO_CODE and scale 0. The table is
    2^(-q/16) rounded once to float32."""
    gen = torch.Generator().manual_seed(8)
    m = torch.rand(2, 500, 3, generator=gen) ** 6 * torch.tensor([1.0, 1e-30, 3e38])
    m[0, :4, 0] = torch.tensor([0.0, float("nan"), float("inf"), -0.0])
    finite = m.isfinite()
    base = m.where(finite, 0.0).amax(dim=1, keepdim=True)
    assert torch.equal(mp_wire.CODE_SCALES, (2.0 ** (-torch.arange(255, dtype=torch.float64) / 16)).float())
    up, s_up = mp_wire._scale_codes(m, base, round_up=True)
    nearest, s_near = mp_wire._scale_codes(m, base, round_up=False)
    special = ~((m > 0) & finite)
    assert (up[special] == mp_wire.ZERO_CODE).all() and (s_up[special] == 0).all() and (nearest[special] == 255).all()
    ok = ~special
    q, b, x = up[ok].long(), base.expand_as(m)[ok], m[ok]
    assert (s_up[ok] >= x).all() and torch.equal(s_up[ok], b * mp_wire.CODE_SCALES[q])
    assert ((q == 254) | (b * mp_wire.CODE_SCALES[(q + 1).clamp(max=254)] < x)).all()
    q = nearest[ok].long()
    assert ((q == 0) | (b * mp_wire.CODE_MIDPOINTS[(q - 1).clamp(min=0)] > x)).all()   # the midpoint above m
    assert ((q == 254) | (b * mp_wire.CODE_MIDPOINTS[q.clamp(max=253)] <= x)).all()   # and the one under it
    assert len(set(up[ok].tolist())) > 50 and (up[ok] == 254).any()  # many codes, and the last
