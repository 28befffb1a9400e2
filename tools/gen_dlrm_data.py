"""Step 1: raw DLRM dataset (real file or synthetic) -> processed dataset folder."""
from __future__ import annotations

import time

from neuroshard.cli import ArgumentParser, run_main
from neuroshard.dataset import SyntheticConfig, generate_synthetic_raw, load_raw, process_raw, save_raw


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", default=None, help="raw dataset (.pt or .pt.gz), e.g. fbgemm_t856_bs65536.pt")
    src.add_argument("--synthetic", action="store_true", help="generate a DLRM-like raw dataset instead")
    p.add_argument("--out-dir", "--out_dir", dest="out_dir", default="data/dlrm_datasets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num_tables", type=int, default=856, help="synthetic: number of tables")
    p.add_argument("--batch_size", type=int, default=4096, help="synthetic: samples in the batch")
    p.add_argument("--row_scale", type=float, default=1.0,
                   help="synthetic: multiply row counts (e.g. 0.01 for small machines)")
    p.add_argument("--save_raw", default=None, help="synthetic: also write the raw tuple here (.pt / .pt.gz)")
    args = p.parse_args(argv)
    if args.data is None and not args.synthetic:
        p.error("pass --data PATH (a raw DLRM dataset) or --synthetic")

    t0 = time.perf_counter()
    if args.synthetic:
        cfg = SyntheticConfig(num_tables=args.num_tables, batch_size=args.batch_size, seed=args.seed,
                              row_scale=args.row_scale)
        print(f"generating synthetic DLRM data: {cfg.num_tables} tables, batch {cfg.batch_size}, seed {cfg.seed}, "
              f"row_scale {cfg.row_scale}")
        raw = generate_synthetic_raw(cfg)
        if args.save_raw:
            print(f"raw dataset written to {save_raw(args.save_raw, *raw)}")
        source = {"source": "synthetic", "synthetic_config": cfg.__dict__, "seed": args.seed}
    else:
        print(f"loading {args.data}")
        raw = load_raw(args.data)
        source = {"source": "file", "data": str(args.data), "seed": args.seed}
    ds = process_raw(*raw, out_dir=args.out_dir, source=source)
    print(ds.summary())
    print(f"processed dataset written to {ds.path} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    run_main(main)
