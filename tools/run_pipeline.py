"""Run the whole pipeline (DESIGN.md §3) with a preset; resumes, skipping finished steps."""
from __future__ import annotations

import sys

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import PipelineConfig
from neuroshard.experiments.pipeline import run_pipeline


def main(argv=None) -> int:
    cfg = config_from_args(PipelineConfig, step_parser(PipelineConfig, __doc__).parse_args(argv))
    run_pipeline(cfg, command="python tools/run_pipeline.py " + " ".join(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    run_main(main)
