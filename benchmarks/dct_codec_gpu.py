"""Probe: one rank's DCT codec stages (sign2 MP both ways, DCT-DP select, encode, decode) against the MLPs' forward +
backward at the `mlperf` shape, on CUDA (CUDA events, medians) and on one CPU thread of the same machine. Prints ms."""
import statistics, sys, time, torch
from neuroshard.compression import mp_wire as W
from neuroshard.training import dct as D
from neuroshard.training.dlrm import DenseArch

WORLD, T, DIM = 4, 26, 128
tables = [7, 7, 6, 6]
segs = [[DIM] * t for t in tables]
widths = [sum(s) for s in segs]


def timer(dev):
    if dev == "cuda":
        def t(fn, reps):
            for _ in range(5): fn()
            out = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); fn(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b))
            return statistics.median(out)
    else:
        def t(fn, reps):
            for _ in range(2): fn()
            out = []
            for _ in range(reps):
                s = time.perf_counter(); fn(); out.append(1e3 * (time.perf_counter() - s))
            return statistics.median(out)
    return t


def run(dev, bn, reps):
    tm = timer(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    B = bn * WORLD
    r = 0
    pooled = torch.randn(B, widths[r], device=dev)
    pieces = [W.sign_encode(torch.randn(B, widths[q], device=dev), segs[q], blocks=WORLD, bits=2)
              .reshape(WORLD, -1)[r] for q in range(WORLD)]
    grads = [torch.randn(bn, widths[q], device=dev) for q in range(WORLD)]
    bw_recv = torch.cat([W.sign_encode(torch.randn(bn, widths[r], device=dev), segs[r], g) for _ in range(WORLD)])
    st = {}
    st["mp fw encode"] = tm(lambda: W.sign_encode(pooled, segs[r], blocks=WORLD, bits=2), reps)
    st["mp fw decodes (4)"] = tm(lambda: [W.sign_decode(pieces[q], segs[q], bn, bits=2) for q in range(WORLD)], reps)
    st["mp bw encodes (4)"] = tm(lambda: [W.sign_encode(grads[q], segs[q], g) for q in range(WORLD)], reps)
    st["mp bw decode"] = tm(lambda: W.sign_decode(bw_recv, segs[r], B, blocks=WORLD), reps)
    model = DenseArch(13, T, DIM, (512, 256), (1024, 1024, 512, 256)).to(dev)
    n = sum(p.numel() for p in model.parameters())
    grad = torch.randn(n, device=dev) * torch.rand(n, device=dev) ** 4
    k = D.keep_count(n, 1 / 386 * 4)  # about DCT-DP's bytes
    tau = D.kth_largest(grad, k)
    st["dp threshold (1/100 steps)"] = tm(lambda: D.kth_largest(grad, k), max(5, reps // 5)) / 100
    def enc():
        idx = D.over_threshold(grad, tau)
        dl, v, _ = D.encode(idx, grad[idx])
        return D.payload_bytes(dl, v, dl.numel()), dl.numel()
    st["dp select + encode"] = tm(enc, reps)
    pay, m = enc()
    out = torch.zeros(n, device=dev)
    st["dp decodes (4)"] = tm(lambda: [D.decode_into(out, pay, m) for _ in range(WORLD)], reps)
    dense = torch.randn(bn, 13, device=dev)
    emb = torch.randn(bn, T, DIM, device=dev, requires_grad=True)
    def step():
        model(dense, emb).sum().backward()
    st["dense fw+bw (denominator)"] = tm(step, reps)
    codec = sum(v for k_, v in st.items() if not k_.startswith("dense"))
    for k_, v in st.items():
        print(f"{dev:5s} bn={bn:5d} {k_:28s} {v:9.3f} ms")
    print(f"{dev:5s} bn={bn:5d} codec total {codec:.3f} ms = {100 * codec / st['dense fw+bw (denominator)']:.0f}% of dense fw+bw "
          f"({n} MLP params, k={k})", flush=True)


torch.set_num_threads(1)
for bn in (128, 1024, 4096):
    if torch.cuda.is_available():
        run("cuda", bn, 50)
    run("cpu", bn, 10 if bn < 4096 else 4)
print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no cuda")
