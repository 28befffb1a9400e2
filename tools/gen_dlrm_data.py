"""Step 1: raw DLRM dataset (real file or synthetic) -> processed dataset folder."""
from __future__ import annotations

from neuroshard.core.cli import ArgumentParser, run_main
from neuroshard.data.dataset import build_dataset


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
    a = p.parse_args(argv)
    build_dataset(a.out_dir, data=a.data, synthetic=a.synthetic, num_tables=a.num_tables, batch_size=a.batch_size,
                  row_scale=a.row_scale, seed=a.seed, save_raw_path=a.save_raw)
    return 0


if __name__ == "__main__":
    run_main(main)
