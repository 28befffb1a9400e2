"""Run the whole pipeline (DESIGN.md §3) with a preset; resumes, skipping finished steps."""
from __future__ import annotations

import sys

from neuroshard.core.cli import ArgumentParser, run_main
from neuroshard.experiments.pipeline import PRESETS, run_pipeline


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--preset", default="quick", choices=list(PRESETS))
    p.add_argument("--work_dir", default=".", help="folder holding data/, models/ and results/")
    p.add_argument("--force", action="store_true", help="redo every step")
    p.add_argument("--gpu_devices", default=None, help="comma-separated GPU ids (CUDA runs)")
    args = p.parse_args(argv)
    run_pipeline(args.preset, args.work_dir, force=args.force, gpu_devices=args.gpu_devices,
                 command="python tools/run_pipeline.py " + " ".join(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    run_main(main)
