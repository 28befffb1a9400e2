"""Probe: would CUDA graphs make DCT-MP's codec pay on a GPU? One rank's sign2 codec work a step at the `mlperf`
shape (4 ranks, 7/7/6/6 tables of 128 columns; forward encode, 4 forward decodes, 4 backward encodes with random
rounding, the backward decode), run eagerly and replayed as one captured CUDA graph, against the MLPs' forward +
backward (eager and captured); DCT-DP's select + encode and 4 decodes eagerly (their sizes vary: not capturable).
Also the top-k wire's encode + 4 decodes (offsets now kept on the device). CUDA events, medians. Prints ms."""
import statistics
import torch

from neuroshard.compression import mp_wire as W
from neuroshard.training import dct as D
from neuroshard.training.dlrm import DenseArch

WORLD, T, DIM = 4, 26, 128
segs = [[DIM] * t for t in (7, 7, 6, 6)]
widths = [sum(s) for s in segs]


def timed(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def graphed(fn):
    """fn captured once as a CUDA graph; returns its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def run(bn):
    dev, r, B = "cuda", 0, bn * WORLD
    torch.cuda.init()
    gen = torch.cuda.default_generators[0]  # random rounding's draws; the default generator is graph-safe
    pooled = torch.randn(B, widths[r], device=dev)
    pieces = [W.sign_encode(torch.randn(B, widths[q], device=dev), segs[q], blocks=WORLD, bits=2)
              .reshape(WORLD, -1)[r].clone() for q in range(WORLD)]
    grads = [torch.randn(bn, widths[q], device=dev) for q in range(WORLD)]
    bw_recv = torch.cat([W.sign_encode(torch.randn(bn, widths[r], device=dev), segs[r], gen) for _ in range(WORLD)])

    def mp_step():
        W.sign_encode(pooled, segs[r], blocks=WORLD, bits=2)
        for q in range(WORLD):
            W.sign_decode(pieces[q], segs[q], bn, bits=2)
        for q in range(WORLD):
            W.sign_encode(grads[q], segs[q], gen)
        W.sign_decode(bw_recv, segs[r], B, blocks=WORLD)

    if PROFILE:
        from torch.profiler import ProfilerActivity, profile
        mp_step()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                mp_step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))
        return
    st = {"mp sign2 codec, eager": timed(mp_step)}
    layout = W.WireLayout(widths, 1 / 36, B)
    enc, _ = W.encode(pooled, layout, r)
    recv = torch.cat([enc.reshape(WORLD, bn, -1)[0].reshape(-1)] * WORLD)  # shapes as from 4 ranks
    layout_r = W.WireLayout([widths[r]] * WORLD, 1 / 36, B)
    st["mp top-k encode + decode, eager"] = timed(lambda: (W.encode(pooled, layout, r), W.decode(recv, layout_r)))
    model = DenseArch(13, T, DIM, (512, 256), (1024, 1024, 512, 256)).to(dev)
    n = sum(p.numel() for p in model.parameters())
    grad = torch.randn(n, device=dev) * torch.rand(n, device=dev) ** 4
    k = D.keep_count(n, 1 / 386 * 4)
    tau = D.kth_largest(grad, k)

    def enc_dp():
        idx = D.over_threshold(grad, tau)
        dl, v, _ = D.encode(idx, grad[idx])
        return D.payload_bytes(dl, v, dl.numel()), dl.numel()

    st["dp select + encode, eager"] = timed(enc_dp)
    pay, m = enc_dp()
    out = torch.zeros(n, device=dev)
    st["dp 4 decodes, eager"] = timed(lambda: [D.decode_into(out, pay, m) for _ in range(WORLD)])
    st["dp threshold (per step, 1/100)"] = timed(lambda: D.kth_largest(grad, k), 10) / 100
    dense = torch.randn(bn, 13, device=dev)
    emb = torch.randn(bn, T, DIM, device=dev, requires_grad=True)

    def mlp():
        model(dense, emb).sum().backward()

    st["MLPs fw+bw, eager"] = timed(mlp)
    for name, fn in (("MLPs fw+bw, one graph", mlp), ("mp sign2 codec, one graph", mp_step)):  # last: a failed
        try:                                                                          # capture can spoil the rest
            st[name] = timed(graphed(fn))
        except Exception as e:  # noqa: BLE001 - a probe: say what failed and go on
            print(f"bn={bn} {name}: capture failed: {type(e).__name__}: {str(e)[:200]}")
    for name, ms in st.items():
        print(f"bn={bn:5d} {name:34s} {ms:8.3f} ms", flush=True)


PROFILE = False
if __name__ == "__main__":
    import sys
    PROFILE = "--profile" in sys.argv
    for bn in ((4096,) if PROFILE else (128, 1024, 4096)):
        run(bn)
    print(torch.__version__, torch.cuda.get_device_name())
