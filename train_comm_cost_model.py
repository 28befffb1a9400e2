"""Step 4b: pre-train the forward and backward communication cost models (DESIGN.md §3.3)."""
from __future__ import annotations

from pathlib import Path

from neuroshard.core.cli import ArgumentParser, add_training_args, comm_model_paths, run_main, training_kwargs
from neuroshard.core.errors import check_int
from neuroshard.models.training import train_comm_models


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--data_dir", default="data/cost_data", help="folder with comm_cost_data_<N>.pkl")
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--fw_out_path", default=None, help="default models/comm_<N>_fw.pt")
    p.add_argument("--bw_out_path", default=None, help="default models/comm_<N>_bw.pt")
    add_training_args(p, epochs=300)
    a = p.parse_args(argv)
    N = check_int("--ndevices", a.ndevices, 2, 4096)
    fw, bw = comm_model_paths("models", N)
    train_comm_models(Path(a.data_dir) / f"comm_cost_data_{N}.pkl", a.fw_out_path or fw, a.bw_out_path or bw,
                      **training_kwargs(a))
    return 0


if __name__ == "__main__":
    run_main(main)
