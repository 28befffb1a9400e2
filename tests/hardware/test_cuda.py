"""The CUDA path: the pure-PyTorch backend on a GPU, CUDA-event timing, one worker / rank per GPU.

Skipped where no GPU is visible (CI); run on a machine with one (e.g. `pytest tests/hardware/test_cuda.py`).
"""
import re

import numpy as np
import pytest
import torch

from neuroshard.core.errors import UserError
from neuroshard.hardware.backends import TorchFusedEmbeddingBag, resolve_hardware
from neuroshard.hardware.collect import load_cost_data
from neuroshard.hardware.compute_bench import COMPUTE_DATA_KIND, ComputeBenchmark
from neuroshard.hardware.launch import cuda_ranks

from conftest import refused, run_script

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_torch_backend_on_cuda_matches_a_float64_reference():
    specs = [(1000, 16), (500, 8), (1000, 16), (70, 4)]
    g = torch.Generator().manual_seed(0)
    B = 64
    lengths = torch.randint(0, 6, (len(specs) * B,), generator=g)
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    ids = torch.cat([torch.randint(0, specs[k // B][0], (int(n),), generator=g) for k, n in enumerate(lengths)])
    op = TorchFusedEmbeddingBag(specs, "cuda")
    before = [w.detach().double().cpu().clone() for w in op.weights()]
    prepared = op.prepare(ids, offsets)
    out = op.forward(prepared)
    assert out.is_cuda and out.shape == (B, sum(d for _, d in specs))
    # reference: per table, per sample, the sum of the rows its bag names, in float64 on the CPU
    ref = torch.zeros(B, sum(d for _, d in specs), dtype=torch.float64)
    tables = before  # weights() gives one (rows, dim) view per table
    col = 0
    for t, (_, d) in enumerate(specs):
        for b in range(B):
            k = t * B + b
            ref[b, col:col + d] = tables[t][ids[offsets[k]:offsets[k + 1]]].sum(0)
        col += d
    assert ((out.double().cpu() - ref).norm() / ref.norm()) < 1e-6
    # one SGD step: every row moves by -lr * (sum of the output gradients of the bags that read it)
    grad = torch.randn(out.shape, generator=g).cuda()
    op.train_step(prepared, grad)
    after = [w.double().cpu() for w in op.weights()]
    expect = [t.clone() for t in tables]
    col = 0
    for t, (_, d) in enumerate(specs):
        for b in range(B):
            k = t * B + b
            for i in ids[offsets[k]:offsets[k + 1]]:
                expect[t][i] -= 0.01 * grad[b, col:col + d].double().cpu()
        col += d
    for a, e in zip(after, expect):
        assert torch.allclose(a, e, atol=1e-6)


def test_cuda_timing_grows_with_the_work(small_dataset):
    hw = resolve_hardware("cuda", "torch")
    bench = ComputeBenchmark(small_dataset, hw, small_dataset.batch_size, warmup_iter=3, num_iter=10)
    one = bench.measure([0], [4])
    many = bench.measure(list(range(8)) * 4, [128] * 32)
    assert 0 < one < many, (one, many)


def test_more_ranks_than_gpus_is_refused_in_one_line(small_dataset, tmp_path, capsys):
    have = torch.cuda.device_count()
    with pytest.raises(UserError, match="GPUs"):
        cuda_ranks(have + 1)
    assert cuda_ranks(have) == list(range(have))
    refused(capsys, "collect_comm_cost_data.py", "--out_dir", tmp_path, "--ndevices", str(have + 1), "--data_size",
            "1", "--batch_size", str(64 * (have + 1)), "--device", "cuda", untouched=[tmp_path],  # nothing half-made
            match=re.escape(_too_few_gpus(have + 1, "rank", have)))


def _too_few_gpus(world, what, have):
    flags = "--workers" if what == "worker" else "--ndevices"
    return (f"error: {world} {what}s on CUDA need {world} GPUs (one each) but {have} {'is' if have == 1 else 'are'} "
            f"visible; pass --device cpu, or fewer {what}s ({flags} / --gpu_devices)")


def test_compute_collection_on_cuda_runs_one_worker_per_gpu(small_dataset, tmp_path, capsys):
    proc = run_script("collect_compute_cost_data.py", "--dataset_dir", small_dataset.path, "--out_dir", tmp_path,
                      "--max_mem", "0.01", "--data_size", "4", "--num_iter", "3", "--warmup_iter", "1",
                      "--backend", "torch")
    assert proc.returncode == 0, proc.stderr
    assert f"{torch.cuda.device_count()} worker(s)" in proc.stdout
    meta, samples = load_cost_data(tmp_path / "compute_cost_data.pkl", COMPUTE_DATA_KIND)
    assert meta["device"] == "cuda" and meta["device_name"] == torch.cuda.get_device_name()
    assert [s["index"] for s in samples] == [0, 1, 2, 3] and all(np.isfinite(s["cost_ms"]) for s in samples)
    have = torch.cuda.device_count()
    refused(capsys, "collect_compute_cost_data.py", "--dataset_dir", small_dataset.path, "--out_dir", tmp_path,
            "--max_mem", "0.01", "--data_size", "5", "--backend", "torch", "--workers", str(have + 1),
            untouched=[tmp_path], quiet=False, match=re.escape(_too_few_gpus(have + 1, "worker", have)))


def test_dct_codecs_give_the_cpu_results_on_cuda():
    """DCT-MP's sign2 forward and DCT-DP's encode, payload and decode take CUDA tensors and give what they give
    on the CPU: the same signs and magnitude bits (scales within one code step, the reductions' order may
    differ), and the same DP payload bytes and decoded sums."""
    from neuroshard.compression import dp_threshold, mp_sign

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256 + 16, generator=g)
    segments = [128, 128, 16]
    cpu = mp_sign.sign_decode(mp_sign.sign_encode(x, segments, blocks=4, bits=2), segments, 64, blocks=4, bits=2)
    enc = mp_sign.sign_encode(x.cuda(), segments, blocks=4, bits=2)
    assert enc.is_cuda and enc.numel() == 4 * mp_sign.sign_block_bytes(segments, 16, bits=2)
    gpu = mp_sign.sign_decode(enc, segments, 64, blocks=4, bits=2).cpu()
    assert torch.equal(torch.sign(gpu), torch.sign(cpu))
    assert ((gpu / cpu - 1).abs() <= 2 ** (1 / 16) - 1 + 1e-6).all()
    grad = torch.randn(300_000, generator=g) * torch.rand(300_000, generator=g) ** 4
    k = dp_threshold.keep_count(grad.numel(), 0.01)
    outs = []
    for dev in ("cpu", "cuda"):
        v = grad.to(dev)
        tau = dp_threshold.kth_largest(v, k)
        idx = dp_threshold.over_threshold(v, tau)
        deltas, vals, _ = dp_threshold.encode(idx, v[idx])
        payload = dp_threshold.payload_bytes(deltas, vals, deltas.numel() + 3)
        out = torch.zeros_like(v)
        dp_threshold.decode_into(out, payload, deltas.numel() + 3)
        outs.append((tau, payload.cpu(), out.cpu()))
    assert outs[0][0] == outs[1][0] and torch.equal(outs[0][1], outs[1][1]) and torch.equal(outs[0][2], outs[1][2])
