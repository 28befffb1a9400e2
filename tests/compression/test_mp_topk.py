"""DCT-MP's top-k codec (compression/mp_topk.py): what one implementation encodes is what arrives.

The all-to-all is played by hand here (rank q receives rows q*B/N..(q+1)*B/N of every rank's send
buffer, in rank order), so encode -> exchange -> decode -> gather -> exchange -> scatter is checked
entry by entry without a process group; tests/training/test_dct.py runs the same code on gloo ranks.
"""
import math

import numpy as np
import pytest
import torch

from neuroshard.compression import mp_topk


def test_keep_count_and_index_type_follow_the_formula():
    assert [mp_topk.keep_count(w, 0.05) for w in (0, 1, 19, 20, 40, 41, 100)] == [0, 1, 1, 1, 2, 2, 5]
    assert mp_topk.keep_count(3, 1.0) == 3 and mp_topk.keep_count(3, 0.99) == 2
    assert [mp_topk.index_dtype(w) for w in (1, 256, 257, 32768, 32769)] == [
        torch.uint8, torch.uint8, torch.int16, torch.int16, torch.int32]
    assert mp_topk.entry_bytes([40, 256]) == 3 and mp_topk.entry_bytes([40, 300]) == 4
    assert mp_topk.entry_bytes([40, 40000]) == 6
    # --mp_scope table: each shard keeps max(1, ceil(keep * w))
    assert [mp_topk.keep_count(w, 0.05, "table") for w in (0, 1, 19, 20, 21, 128, 100)] == [0, 1, 1, 1, 2, 7, 5]
    assert mp_topk.keep_count(128, 0.0625, "table") == 8 and mp_topk.keep_count(3, 1.0, "table") == 3


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
    layout = mp_topk.TopKLayout(widths, keep, B, segments)
    seg_widths = widths if segments is None else [w for seg in segments for w in seg]
    entry = 2 + mp_topk.index_dtype(max(seg_widths)).itemsize  # fp16 value + index within a segment
    if segments is not None and max(seg_widths) <= 256:
        assert entry == 3  # uint8 indices, even where a rank is wider than 256 columns
    assert layout.ks == _segment_counts(widths, keep, segments)
    enc = [mp_topk.encode(p, layout, r) for r, p in enumerate(pooled)]
    for r, (send, idx) in enumerate(enc):
        assert send.dtype == torch.uint8 and send.numel() == mp_topk.fw_send_bytes(widths, r, B, keep, segments)
        assert send.numel() == B * layout.ks[r] * entry
    e = layout.entry
    recvs = _exchange([s.reshape(-1) for s, _ in enc], bn, world,
                      lambda s, r, q: s[q * bn * layout.ks[r] * e: (q + 1) * bn * layout.ks[r] * e])
    grads_sent, recv_idx_of = [], []
    for q in range(world):
        dense, recv_idx = mp_topk.decode(recvs[q], layout)
        pos = 0
        for r, w in enumerate(widths):
            got = dense[pos: pos + bn * w].reshape(bn, w)
            pos += bn * w
            # expected: rank r's samples of rank q, only each sample's k_r largest |entries|, fp16-rounded
            rows = pooled[r][q * bn:(q + 1) * bn]
            want = torch.zeros(bn, w)
            start = 0
            for sw in (([w] if w else []) if segments is None else segments[r]):  # each segment's own top-k
                k = mp_topk.keep_count(sw, keep, "rank" if segments is None else "table")
                top = rows[:, start:start + sw].abs().topk(k, dim=1).indices + start
                want.scatter_(1, top, rows.gather(1, top).half().float())
                start += sw
            assert torch.equal(got, want)
        assert pos == dense.numel()
        # backward: every received entry's gradient goes back, fp32, nothing else
        grad = torch.arange(dense.numel(), dtype=torch.float32) + 0.5
        send = mp_topk.gather_grads(grad, layout, recv_idx)
        assert send.numel() * 4 == mp_topk.bw_send_bytes(widths, B, keep, segments) == bn * sum(layout.ks) * 4
        grads_sent.append(send)
        recv_idx_of.append(recv_idx)
    offsets = [np.cumsum([0] + [bn * k for k in layout.ks])[r] for r in range(world)]
    for r, w in enumerate(widths):
        k = layout.ks[r]
        out = torch.cat([grads_sent[q][offsets[r]: offsets[r] + bn * k] for q in range(world)])
        g_pooled = mp_topk.scatter_grads(out, enc[r][1], w)
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
    layout = mp_topk.TopKLayout([4, 4], 0.5, 2)
    send, idx = mp_topk.encode(torch.tensor([[1e6, -1e6, 0.0, 1.0], [0.0, 2.0, -3.0, 1e-3]]), layout, 0)
    dense, _ = mp_topk.decode(send[:1].reshape(-1), mp_topk.TopKLayout([4], 0.5, 1))
    assert torch.equal(dense.reshape(4), torch.tensor([65504.0, -65504.0, 0.0, 0.0]))


def test_segments_must_add_up_to_the_ranks_widths():
    with pytest.raises(ValueError, match="do not add up"):
        mp_topk.TopKLayout([40, 8], 0.05, 4, [[16, 16], [8]])


def test_one_sample_per_rank_decodes():
    """bn = 1 (a batch of one sample per rank): a one-row column slice of the received bytes has a row stride
    of the whole entry block (here 3 bytes: fp16 value + uint8 index), which a dtype view refuses unless the
    slice is made dense first."""
    layout = mp_topk.TopKLayout([20], 0.05, 1)
    x = torch.zeros(1, 20)
    x[0, 7] = -2.5
    send, _ = mp_topk.encode(x, layout, 0)
    assert send.shape == (1, 3)
    dense, (idx,) = mp_topk.decode(send.reshape(-1), layout)
    assert torch.equal(dense, x.reshape(-1)) and idx.tolist() == [[7]]


def test_topk_layout_offsets_go_to_a_device_once():
    """The top-k wire's per-rank column offsets are copied to another device once per layout and reused by every
    encode and decode; on their own device they are used as they are. The meta device stands in for a GPU."""
    layout = mp_topk.TopKLayout([24, 16], 0.25, 8, segments=[[16, 8], [16]])
    assert layout.offsets_on(0, torch.device("cpu")) is layout.offsets[0]
    meta = torch.device("meta")
    first = layout.offsets_on(0, meta)
    assert first.device == meta and first.shape == layout.offsets[0].shape
    assert layout.offsets_on(0, meta) is first and layout.offsets_on(1, meta) is not first
    assert layout.offsets[0].tolist() == [0] * 4 + [16] * 2  # per shard k = ceil(0.25 w), at its start column
    other = mp_topk.TopKLayout([24, 16], 0.25, 8, segments=[[16, 8], [16]])
    assert other.offsets_on(0, meta) is not first  # per layout, not shared through ids
