"""DCT on real gloo ranks: keep=1.0 is bit-identical to no compression, the DP threshold is refreshed
exactly every --dp_refresh steps, bytes match the formula, dropped MP entries get zero gradient, and
training learns a planted problem."""
import json
import math

import pandas as pd
import pytest
import torch

from neuroshard.compression import mp_sign
from neuroshard.core.errors import UserError
from neuroshard.hardware.launch import run_processes
from neuroshard.training.dlrm import DenseArch
from neuroshard.training.dct_results import STEP_PARTS, step_part_cells, step_parts
from neuroshard.training.train import TrainConfig, dense_arch, train_dlrm, train_runs

import dct_workers

pytest.importorskip("recbole", reason="MovieLens-100K ships in the recbole wheel")

SMALL = dict(dataset="movielens", ndevices=2, steps=12, batch_size=128, log_every=4)


@pytest.fixture(scope="module")
def movielens():
    """MovieLens-100K, loaded once for the module (a load takes seconds; train_dlrm's own load of the
    dataset it is named runs in test_ctrl_c_stops_every_rank, where the script trains on it)."""
    from neuroshard.training.data import load_movielens

    return load_movielens()


@pytest.fixture(scope="module")
def baseline(movielens):
    """The uncompressed run, its ranks spawned by train_dlrm itself: the reference the grouped runs must equal."""
    return train_dlrm(TrainConfig(**{**SMALL, "dct": "none"}), progress=False, data=movielens)


# The module's other 2-rank MovieLens runs, trained on one group of ranks spawned once (train_runs, as the
# benchmarks do) rather than a spawn each; every test reads its own runs. "unrelated" runs first, so the
# keep-1.0 runs compared with the self-spawned baseline follow a run of other settings on the same ranks.
GROUP = {
    "unrelated": dict(dct="both", steps=3),
    "dp_keep_one": dict(dct="dp", dp_keep=1.0, dp_refresh=1),
    "mp_keep_one": dict(dct="mp", mp_keep=1.0),
    "mp_keep_one_rank": dict(dct="mp", mp_keep=1.0, mp_scope="rank"),
    "dp_keep_one_sgd_freeze_off": dict(dct="dp", dp_keep=1.0, dense_opt="sgd", dp_adam_freeze_after=0, dp_adam_floor=0.5),
    "eval_every_4": dict(dct="both", eval_every=4),
    "eval_every_6": dict(dct="both", eval_every=6),
    "refresh_10": dict(dct="dp", steps=25, dp_refresh=10, dp_drift=1000),
    "dp_keep_1pct": dict(dct="both", dp_keep=0.01, dp_refresh=1, error_feedback=False, mp_scope="table"),
    "mp_rank": dict(dct="mp", mp_scope="rank"),
    "mp_sign": dict(dct="mp", mp_scope="sign"),
    "mlperf_none": dict(dct="none", arch="mlperf", steps=6),
    "mlperf_both": dict(dct="both", arch="mlperf", steps=6),
}


@pytest.fixture(scope="module")
def group(movielens):
    return dict(zip(GROUP, train_runs([TrainConfig(**{**SMALL, **kw}) for kw in GROUP.values()], movielens)))


def test_keep_one_is_bit_identical_to_no_compression(baseline, group):
    """Run on one group of ranks (train_runs, as the benchmarks do) after an unrelated run: still
    bit-identical to the self-spawned uncompressed run."""
    assert list(GROUP).index("dp_keep_one") > list(GROUP).index("unrelated")
    for r in (group["dp_keep_one"], group["mp_keep_one"], group["mp_keep_one_rank"], group["dp_keep_one_sgd_freeze_off"]):
        assert r["_losses"] == baseline["_losses"]
        assert r["_preds"] == baseline["_preds"]


def test_async_and_sync_dp_hooks_train_bit_identically(movielens):
    """--dp_sync on (blocking collectives) and off (the default: asynchronous, overlapping backward) give
    the same training, bit for bit, at the mlperf shape (2.1M dense parameters in several DDP buckets,
    rebuilt after the first step), for DCT-DP and for the dense hook; the asynchronous runs record the
    DP wait and DCT-DP's and DCT-MP's compression work apart."""
    kw = {**SMALL, "arch": "mlperf", "steps": 4, "log_every": 2}
    cfgs = [TrainConfig(**kw, dct=dct, dp_sync=sync) for dct in ("both", "none") for sync in (True, False)]
    both_sync, both_async, none_sync, none_async = train_runs(cfgs, movielens)
    for a, b in ((both_sync, both_async), (none_sync, none_async)):
        assert a["_losses"] == b["_losses"] and a["_preds"] == b["_preds"]
        assert a["dp_bytes_per_step"] == b["dp_bytes_per_step"]
    assert both_async["_refreshed_at"] == both_sync["_refreshed_at"]
    assert both_async["dp_codec_ms"] > 0 and none_async["dp_codec_ms"] == 0
    assert both_async["mp_codec_ms"] > 0 and none_async["mp_codec_ms"] == 0  # DCT-MP's coding, apart from compute
    for r in (both_async, none_async):
        assert r["compute_ms"] > 0
        parts = step_parts(r, 3)  # the line every DCT benchmark prints: its parts add up to the step
        step, rest = parts.removeprefix("step ").split(" ms = ")
        assert [name.rsplit(" ", 1)[0] for name in rest.split(" + ")] == [n for n, _ in STEP_PARTS]
        assert abs(sum(float(x.rsplit(" ", 1)[1]) for x in rest.split(" + ")) - float(step)) < 0.01
    cells = step_part_cells(pd.DataFrame([both_async, both_async]))
    assert cells["MP codec"] == f"{both_async['mp_codec_ms']:.1f}" and cells["step (ms)"] == f"{both_async['step_ms']:.1f}"
    assert step_part_cells(pd.DataFrame([{"step_ms": 3.0, "compute_ms": 2.0}]))["DP codec"] == "-"  # an older row
    assert min(r["dp_comm_ms"] for r in (both_sync, both_async, none_sync, none_async)) >= 0


def test_summary_names_each_recorded_column_and_compute_is_the_rest():
    """`summarize` reads each part of a step from its own recorded column (STEP_RECORD), as medians over ranks'
    means after the warm-up steps, and compute is the step less the other parts of STEP_PARTS."""
    from types import SimpleNamespace

    from neuroshard.training.train import STEP_RECORD, summarize

    values = {"step_ms": 0.100, "mp_comm_ms": 0.020, "dp_comm_ms": 0.010, "mp_bytes": 700.0, "dp_bytes": 300.0,
              "dp_codec_ms": 0.004, "mp_codec_ms": 0.002}
    steps = torch.tensor([values[c] for c in STEP_RECORD], dtype=torch.float64).repeat(2, 12, 1).numpy()
    steps[:, 0, 0] = 9.0  # the first step warms up: left out of the medians
    cfg = TrainConfig(ndevices=2, steps=12)
    data = SimpleNamespace(dense=torch.zeros(1, 13), num_rows=[10] * 4)
    r = summarize(cfg, data, ([0.2, 0.8], [0, 1], steps, [], [[0.5] * 12] * 2, []), wall=1.0)
    assert r["step_ms"] == pytest.approx(100) and r["mp_comm_ms"] == pytest.approx(20)
    assert r["dp_comm_ms"] == pytest.approx(10) and r["dp_codec_ms"] == pytest.approx(4)
    assert r["mp_codec_ms"] == pytest.approx(2) and r["compute_ms"] == pytest.approx(64)
    assert r["mp_bytes_per_step"] == pytest.approx(1400) and r["dp_bytes_per_step"] == pytest.approx(600)
    assert step_parts(r, 0) == "step 100 ms = compute 64 + DP codec 4 + MP codec 2 + MP comm 20 + DP comm 10"


def test_early_stopping_scores_do_not_disturb_training_and_pick_the_best_validation_step(baseline, group):
    """--eval_every: scoring mid-training leaves training bit-identical (4 vs 6 steps apart, same held-out
    tenth), the last scoring equals the final test AUC, and the reported test AUC is the one at the step
    of the best validation AUC."""
    a, b = group["eval_every_4"], group["eval_every_6"]
    assert a["_losses"] == b["_losses"] and a["_preds"] == b["_preds"]
    assert a["_losses"] != baseline["_losses"]  # a tenth of the training split held out: other batches
    curve = {int(k): v for k, v in json.loads(a["eval_curve"]).items()}
    assert sorted(curve) == [4, 8, 12] and sorted(json.loads(b["eval_curve"])) == ["12", "6"]
    assert curve[12][1] == pytest.approx(a["test_auc"], abs=1e-5) == pytest.approx(b["test_auc"], abs=1e-5)
    best = max(sorted(curve), key=lambda s: curve[s][0])
    assert a["best_step"] == best and a["test_auc_at_best"] == pytest.approx(curve[best][1], abs=1e-5)
    assert a["best_valid_auc"] == pytest.approx(curve[best][0], abs=1e-5)
    assert a["num_test"] == baseline["num_test"]  # the test split is untouched
    with pytest.raises(UserError, match="--eval_every"):
        TrainConfig(**{**SMALL, "eval_every": 13}).check()


def test_threshold_is_recomputed_exactly_every_refresh(group):
    r = group["refresh_10"]
    assert (r["dct"], r["steps"], r["dp_refresh"], r["dp_drift"]) == ("dp", 25, 10, 1000)
    assert r["_refreshed_at"] == [(0, 0, "scheduled"), (10, 0, "scheduled"), (20, 0, "scheduled")]  # one bucket


def test_bytes_match_the_formula(baseline, group):
    B, N, T, D = 128, 2, 8, 16
    n = sum(p.numel() for p in DenseArch(4, T, D).parameters())
    off = (N - 1) / N                                           # the share of the pooled entries that leaves a rank
    assert baseline["mp_bytes_per_step"] == 2 * 4 * B * T * D * off  # every such entry, forward and backward
    assert baseline["dp_bytes_per_step"] == N * 4 * n           # every rank all_reduces every gradient
    r = group["dp_keep_1pct"]
    k = int(0.01 * n)                                           # one bucket: a fresh tau keeps exactly k
    assert r["dp_bytes_per_step"] == N * (4 + k * (2 + 2))      # int32 count + k uint16 deltas + k fp16 values
    # --mp_scope table: each of the 8 whole tables keeps max(1, ceil(0.05 * 16)) = 1 entry
    assert r["mp_bytes_per_step"] == B * T * 1 * ((2 + 1) + 4) * off  # fp16 value + uint8 index fw, fp32 grad bw
    r = group["mp_rank"]
    widths = [T * D // N] * N                                   # size_lookup_greedy splits evenly here
    ks = [max(1, int(0.05 * w)) for w in widths]                # per rank: floor(0.05 * 64) = 3
    assert r["mp_bytes_per_step"] == sum(B * kr * (2 + 1) + B * kr * 4 for kr in ks) * off  # fp16 + uint8, fp32
    r = group["mp_sign"]                                        # 16 sign bits + a 1-byte scale code per sample and
    # table, and a fp32 base per table in each block (one block per pair of different ranks): the same both ways
    assert r["mp_bytes_per_step"] == 2 * (B * T * (16 // 8 + 1) * off + (N - 1) * T * 4)
    assert math.isfinite(r["test_logloss"]) and r["test_auc"] > 0.5


def test_given_plans_are_the_ones_trained(movielens):
    """train_runs(shards=...) trains each run on its own plan: DCT-MP's bytes follow each plan's widths."""
    B, D = 128, 16
    lopsided = [[(t, 0, D) for t in range(6)], [(6, 0, D), (7, 0, D)]]            # widths 96 | 32
    split = [[(t, 0, D) for t in range(4)] + [(4, 0, 8), (5, 0, 8)],                # widths 80 | 48
             [(4, 8, 8), (5, 8, 8), (6, 0, D), (7, 0, D)]]
    cfg = TrainConfig(**{**SMALL, "dct": "mp", "steps": 3, "mp_scope": "rank"})
    table = TrainConfig(**{**SMALL, "dct": "mp", "steps": 3, "mp_scope": "table"})
    a, b, c = train_runs([cfg, cfg, table], movielens, shards=[lopsided, split, split])
    for r, widths in ((a, (96, 32)), (b, (80, 48))):
        ks = [max(1, int(0.05 * w)) for w in widths]                               # (4, 1) and (4, 2)
        assert r["mp_bytes_per_step"] == sum(B * k * (2 + 1) + B * k * 4 for k in ks) / 2  # half leaves a rank
    assert a["mp_bytes_per_step"] != b["mp_bytes_per_step"]
    # per shard, max(1, ceil(0.05 * w)) = 1 for widths 16 and 8: 6 shards on rank 0, 4 on rank 1
    assert c["mp_bytes_per_step"] == B * (6 + 4) * ((2 + 1) + 4) / 2
    (alone,) = train_runs([cfg], movielens, shards=[lopsided])   # one run alone (a resumed benchmark)
    assert alone["_losses"] == a["_losses"]
    with pytest.raises(UserError, match="one plan per run"):
        train_runs([cfg, cfg], movielens, shards=[lopsided])
    with pytest.raises(UserError, match="one shard list per rank"):
        train_runs([cfg], movielens, shards=[lopsided + [[]]])


def test_mlperf_shape_meets_the_byte_targets_at_the_defaults(group):
    """The MLPerf DLRM shape (2.1M dense parameters, several DDP buckets rebuilt after step 1) at the
    default settings: DCT-DP >= 100x and DCT-MP >= 20x fewer bytes than uncompressed, every byte counted."""
    base, r = group["mlperf_none"], group["mlperf_both"]
    assert (base["arch"], base["dct"], r["arch"], r["dct"]) == ("mlperf", "none", "mlperf", "both")
    assert base["dense_params"] > 2_000_000
    assert base["dp_bytes_per_step"] == 2 * 4 * base["dense_params"]
    assert base["dp_bytes_per_step"] / r["dp_bytes_per_step"] >= 100
    assert base["mp_bytes_per_step"] / r["mp_bytes_per_step"] >= 20
    # forward + backward, B x T x D fp32, of which half (the peer's samples) leaves each of the 2 ranks
    assert base["mp_bytes_per_step"] == 2 * 4 * 128 * 8 * 128 / 2
    # the default scope sign2 on 8 whole tables of 128 columns: per sample and table 2 x 16 bytes of bits + a
    # scale code forward, 16 + 1 back; a fp32 base per table in each block (one block per pair of different
    # ranks), each way
    assert r["mp_bytes_per_step"] == 128 * 8 * (33 + 17) / 2 + 2 * 8 * 4


KEEPS = [0.25, 1.0]


@pytest.fixture(scope="module")
def topk_runs():
    """Every keep of KEEPS on one group of 2 ranks: {(keep, rank): (pooled, grad, recv, bytes)}."""
    got = {}
    run_processes(dct_workers.topk_gradients, 2, (KEEPS + ["sign", "sign2"],), lambda m: got.__setitem__(m[:2], m[2:]),
                  group_device="cpu")
    return got


@pytest.mark.parametrize("keep", KEEPS)
def test_dropped_mp_entries_get_zero_gradient(topk_runs, keep):
    got = {rank: v for (k, rank), v in topk_runs.items() if k == keep}
    assert sorted(got) == [0, 1]
    for rank, (pooled, grad, recv, nbytes) in got.items():
        pooled, grad, recv = map(torch.from_numpy, (pooled, grad, recv))
        k = max(1, int(keep * pooled.shape[1]))
        top = pooled.abs().topk(k, dim=1).indices
        mask = torch.zeros_like(pooled, dtype=torch.bool).scatter(1, top, True)
        assert (grad[~mask] == 0).all()
        assert (grad[mask] != 0).all()
        assert (recv != 0).sum() == 3 * (max(1, int(keep * 8)) + max(1, int(keep * 12)))


STEP = 2 ** (1 / 16)  # the sign scope's scale codes: steps of 2^(1/16)


def _check_sign_exchange(topk_runs, scope, segments, bn=3):
    """Scope sign or sign2 on 2 gloo ranks: each rank receives every entry of a peer's 1-bit shard as its shard's
    mean |x| (to a scale code: within half a step; the block's largest exactly) times its sign, and every entry of
    a 2-bit shard (sign2, from 88 columns) as its sign times s or 3 s, whichever is nearer |x|; its own piece
    exactly. Its pooled embeddings get the gradients of its own piece exactly and the peer's (loss = sum(recv *
    1..n), so recv's gradient is 1..n) randomly rounded to +-M per shard, as the peer's generator (seeded 0, one
    draw per peer piece in rank order) drew them. Bytes: only what leaves the rank; per block (the peer's
    samples) a fp32 base per shard, per sample and shard the bits and a one-byte code."""
    bits = 2 if scope == "sign2" else 1
    pooled = {r: torch.from_numpy(topk_runs[(scope, r)][0]) for r in (0, 1)}
    for r in (0, 1):
        _, _, recv, nbytes = topk_runs[(scope, r)]
        recv, pos = torch.from_numpy(recv), 0
        for q in (0, 1):
            rows = pooled[q][r * bn:(r + 1) * bn]
            got = recv[pos:pos + rows.numel()].reshape(rows.shape)
            sent = torch.arange(pos + 1, pos + rows.numel() + 1, dtype=torch.float32).reshape(rows.shape)
            back = torch.from_numpy(topk_runs[(scope, q)][1])[r * bn:(r + 1) * bn]
            pos += rows.numel()
            if q == r:  # its own piece: exact both ways
                assert torch.equal(got, rows) and torch.equal(back, sent)
                continue
            start = 0
            for w in segments[q]:
                seg, dec = rows[:, start:start + w], got[:, start:start + w]
                start += w
                assert torch.equal(torch.sign(dec), torch.where(seg >= 0, 1.0, -1.0))
                if mp_sign.shard_bits(w, bits) == 2:
                    s = dec.abs().amin(1, keepdim=True)
                    level = dec.abs() / s
                    assert ((level == 1) | ((level - 3).abs() < 1e-6)).all() and (level > 2).any()
                    assert ((seg.abs() >= 2 * s) == (level > 2)).all()  # the nearer level
                    continue
                mean = seg.abs().mean(1, dtype=torch.float64).float()  # summed in float64, as the codec does
                assert (dec.abs() == dec.abs()[:, :1]).all()
                ratio = dec.abs()[:, 0] / mean
                assert (ratio <= STEP ** 0.5 * 1.0001).all() and (ratio >= STEP ** -0.5 / 1.0001).all()
                assert dec.abs()[mean.argmax(), 0] == mean.max()  # the base: the block's largest scale, exact
            # the gradient rank r sent back to q: 1..n at q's piece, rounded with r's generator's first draws
            gen = torch.Generator().manual_seed(0)
            assert torch.equal(back, mp_sign.sign_decode(mp_sign.sign_encode(sent, segments[q], gen), segments[q], bn))
            start = 0
            for w in segments[q]:  # every entry +-M, M >= the shard's max |g| and within one code step of it
                m, g = back[:, start:start + w].abs(), sent[:, start:start + w]
                start += w
                assert (m == m[:, :1]).all() and (m[:, 0] >= g.amax(1)).all() and (m[:, 0] <= g.amax(1) * STEP).all()
        # forward: this rank's shards in one block for its peer (3 samples); backward: one block of the peer's
        # shards
        fw = mp_sign.sign_block_bytes(segments[r], bn, bits)
        bw = mp_sign.sign_block_bytes(segments[1 - r], bn)
        assert nbytes == fw + bw
    return {r: topk_runs[(scope, r)][3] for r in (0, 1)}


def test_sign_scope_sends_one_bit_per_entry_and_a_scale_per_shard_both_ways(topk_runs):
    nbytes = _check_sign_exchange(topk_runs, "sign", [[5, 3], [12]])
    assert nbytes == {0: (3 * (2 + 2) + 8) + (3 * 3 + 4), 1: (3 * 3 + 4) + (3 * 4 + 8)}


def test_sign2_scope_sends_two_bits_forward_on_wide_shards_and_the_sign_scopes_backward(topk_runs):
    """Rank 0's shards of 96 and 8 columns, rank 1's of 128: 2 bits forward on the 96 and the 128 (25 and 33
    bytes a sample), 1 on the 8 (2 bytes); backward 1 bit on all (13, 2 and 17 bytes)."""
    nbytes = _check_sign_exchange(topk_runs, "sign2", [[96, 8], [128]])
    assert nbytes == {0: (3 * (25 + 2) + 8) + (3 * 17 + 4), 1: (3 * 33 + 4) + (3 * 15 + 8)}


def test_four_ranks_train_with_both_compressions(movielens):
    r = train_dlrm(TrainConfig(**{**SMALL, "dct": "both", "ndevices": 4, "steps": 8}), progress=False, data=movielens)
    assert r["num_test"] > 19_000 and math.isfinite(r["test_logloss"])
    assert r["mp_bytes_per_step"] > 0 and r["dp_bytes_per_step"] > 0


def test_planted_problem_is_learned():
    """Label = [dense_0 + (+1 if table 0's id is even else -1) > 0]: the dense MLP must learn one weight
    and table 0's embeddings (sharded and all-to-all'd) must learn each id's parity."""
    from neuroshard.training.data import make_synthetic

    data = make_synthetic(20_000, num_tables=4, max_rows=50, seed=0)
    first_id = data.ids[0][data.offsets[0][:-1]]
    data.labels = ((data.dense[:, 0] + torch.where(first_id % 2 == 0, 1.0, -1.0)) > 0).float()
    data.offsets[0] = torch.arange(data.num_samples + 1)  # one id per sample in table 0
    data.ids[0] = first_id
    cfgs = [TrainConfig(dataset="synthetic", ndevices=2, steps=200, batch_size=256, log_every=50, dct=dct,
                        dense_opt=opt, lr=lr, dp_adam_freeze_after=freeze)
            for opt, lr, dct, freeze in (("adam", None, "none", 0), ("sgd", 1.0, "none", 0), ("sgd", 1.0, "dp", 0),
                                         ("adam", None, "dp", 0), ("adam", None, "dp", 50))]
    final = {}
    for c, r in zip(cfgs, train_runs(cfgs, data)):
        curve = [v for _, v in sorted((int(k), v) for k, v in json.loads(r["loss_curve"]).items())]
        final[c.dense_opt, c.dct + ("-freeze" if c.dp_adam_freeze_after else "")] = r["test_auc"], curve[-1], curve[0]
        assert (r["dense_opt"], r["lr"]) == (c.dense_opt, c.lr or 1e-3)  # recorded in the result row
    for key in (("adam", "none"), ("sgd", "none"), ("sgd", "dp")):  # DCT-DP: 0.5% of the entries, error feedback
        auc, last, first = final[key]
        assert auc > 0.95 and last < 0.5 * first, (key, final[key])
    # With SGD, error feedback delays an MLP entry's gradient but applies all of it, so DCT-DP keeps pace with
    # the uncompressed run; Adam scales each late, accumulated arrival to about its learning rate, so in the
    # same 200 steps DCT-DP under Adam is still far behind (measured: loss 0.48 vs 0.09).
    assert final["sgd", "dp"][1] < 2 * final["sgd", "none"][1]
    assert final["adam", "dp"][1] > 3 * final["adam", "none"][1]
    # --dp_adam_freeze_after 50: 50 dense steps, then Adam's second moment frozen (floored): the update is linear
    # in the gradient, so DCT-DP's lumps arrive in full and Adam + DCT-DP learns the problem
    auc, last, first = final["adam", "dp-freeze"]
    assert auc > 0.95 and last < 0.5 * first, final["adam", "dp-freeze"]


def test_bad_settings_are_refused():
    with pytest.raises(UserError, match="--batch_size 130 is not divisible"):
        TrainConfig(batch_size=130, ndevices=4).check()
    with pytest.raises(UserError, match="--dp_keep"):
        TrainConfig(dp_keep=0).check()
    with pytest.raises(UserError, match="--dct"):
        TrainConfig(dct="all").check()
    with pytest.raises(UserError, match="--arch must be one of tiny, mlperf"):
        TrainConfig(arch="huge").check()
    for bad in ("512-", "512,256", "0-4", "a-b", "-1"):
        with pytest.raises(UserError, match="--top_mlp must be layer widths joined by '-'"):
            TrainConfig(top_mlp=bad).check()
    with pytest.raises(UserError, match="--dp_drift"):
        TrainConfig(dp_drift=0.5).check()
    with pytest.raises(UserError, match="--dp_sync must be on or off, got 'yes'"):
        TrainConfig(dp_sync="yes").check()
    for bad in (0, 0.5, float("nan"), float("inf"), 1e9):
        with pytest.raises(UserError, match="--rendezvous_timeout_s must be a finite number >= 1"):
            TrainConfig(rendezvous_timeout_s=bad).check()
    with pytest.raises(UserError, match="--dense_opt must be one of sgd, adam, got 'lamb'"):
        TrainConfig(dense_opt="lamb").check()
    with pytest.raises(UserError, match="--lr"):
        TrainConfig(dense_opt="sgd", lr=0).check()
    assert (TrainConfig().resolved().lr, TrainConfig(dense_opt="adam").resolved().lr) == (1.0, 1e-3)
    assert TrainConfig().dense_opt == "sgd"
    assert TrainConfig(dense_opt="sgd", lr=0.7).resolved().lr == 0.7
    with pytest.raises(UserError, match="--mp_scope must be one of rank, table, sign, sign2, got 'shard'"):
        TrainConfig(mp_scope="shard").check()
    for bad in (-1, 1001, 2.5, "x"):
        with pytest.raises(UserError, match="--dp_adam_freeze_after"):
            TrainConfig(dense_opt="adam", dp_adam_freeze_after=bad).check()
    with pytest.raises(UserError, match="--dp_adam_freeze_after 50 needs --dense_opt adam, got 'sgd'"):
        TrainConfig(dense_opt="sgd", dp_adam_freeze_after=50).check()
    for bad in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(UserError, match="--dp_adam_floor"):
            TrainConfig(dp_adam_floor=bad).check()
    assert (TrainConfig().mp_scope, TrainConfig().dp_adam_freeze_after) == ("sign2", 0)
    c = TrainConfig(arch="mlperf", bottom_mlp="100-50").resolved()
    assert (c.bottom_mlp, c.top_mlp, c.emb_dim) == ("100-50", "1024-1024-512-256", 128)
    assert [m.out_features for m in dense_arch(c, 4, 8).bottom if hasattr(m, "out_features")] == [100, 50, 128]


def test_bad_runs_are_refused_before_training(tmp_path, movielens):
    other = tmp_path / "other.csv"
    other.write_text("table,rows\n0,10\n")
    with pytest.raises(UserError, match="is not a training results file"):
        train_dlrm(TrainConfig(**SMALL), other, progress=False)
    assert other.read_text() == "table,rows\n0,10\n"
    with pytest.raises(UserError, match="--batch_size 81920 is more than the 80,000 training samples"):
        train_dlrm(TrainConfig(**{**SMALL, "batch_size": 81920}), tmp_path / "r.csv", progress=False, data=movielens)
    assert not (tmp_path / "r.csv").exists()


def test_ctrl_c_stops_every_rank(tmp_path):
    import os
    import re
    import signal
    import subprocess
    import sys
    import threading
    import time

    from conftest import ROOT, popen_interruptible

    proc = popen_interruptible([sys.executable, str(ROOT / "tools/train_dlrm.py"), "--ndevices", "2", "--steps", "100000",
                                "--batch_size", "128", "--results_csv", str(tmp_path / "r.csv")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = bytearray()
    reader = threading.Thread(target=lambda: [err.extend(b) for b in iter(lambda: proc.stderr.read1(4096), b"")],
                              daemon=True)
    reader.start()
    deadline = time.time() + 180  # Ctrl-C once the ranks train (the bar has counted steps), however loaded the machine
    while time.time() < deadline and proc.poll() is None and not re.search(rb"\| *[1-9]\d*/100000", bytes(err)):
        time.sleep(0.2)
    assert proc.poll() is None, bytes(err).decode(errors="replace")
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    reader.join(timeout=10)
    assert proc.returncode == 130, bytes(err).decode(errors="replace")
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("ranks left behind")
    assert not (tmp_path / "r.csv").exists()  # an interrupted run leaves no half result
