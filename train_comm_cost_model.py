"""Step 4b: pre-train the forward and backward communication cost models (DESIGN.md §3.3)."""
from __future__ import annotations

from pathlib import Path

from neuroshard.cli import ArgumentParser, run_main
from neuroshard.cost_models import train_comm_models
from neuroshard.train_cli import add_training_args, training_kwargs


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--data_dir", default="data/cost_data", help="folder with comm_cost_data_<N>.pkl")
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--fw_out_path", default=None, help="default models/comm_<N>_fw.pt")
    p.add_argument("--bw_out_path", default=None, help="default models/comm_<N>_bw.pt")
    add_training_args(p, epochs=300)
    args = p.parse_args(argv)
    kw = training_kwargs(args)
    N = args.ndevices
    train_comm_models(Path(args.data_dir) / f"comm_cost_data_{N}.pkl", args.fw_out_path or f"models/comm_{N}_fw.pt",
                      args.bw_out_path or f"models/comm_{N}_bw.pt", args.epochs, args.num_samples, **kw)
    return 0


if __name__ == "__main__":
    run_main(main)
