"""The pipeline's report step answers missing, damaged or mixed-up results files with one line naming
the command that writes them again (and that command parses back to the step's own config)."""
import shlex

import pytest

from neuroshard.core.cli import config_from_args, step_parser
from neuroshard.core.config import EvalConfig, EvalSimConfig, PipelineConfig
from neuroshard.core.errors import UserError
from neuroshard.experiments.pipeline import build_steps, report_step

GOOD = "alg,task,oom,cost_ms,search_s,sim_cost_ms\nneuroshard,0,False,1.5,0.1,1.4\ndim_greedy,0,False,2.0,0.01,1.9\n"


def _work(tmp_path, sim=GOOD, ev=GOOD, meta='{"device": "cpu"}'):
    res = tmp_path / "results"
    res.mkdir(exist_ok=True)
    for name, text in (("sim_4.csv", sim), ("eval_4.csv", ev), ("eval_4_ratio_tasks.csv", GOOD)):
        if text is not None:
            (res / name).write_bytes(text if isinstance(text, bytes) else text.encode())
            (res / f"{name}.meta.json").write_text(meta)
    cfg = PipelineConfig(work_dir=str(tmp_path))
    return cfg, build_steps(cfg)


@pytest.mark.parametrize("kw,fragment,step", [
    ({"sim": None}, "sim_4.csv is missing; rerun step 5 with: python eval_simulator.py", 5),
    ({"ev": None}, "eval_4.csv is missing; rerun step 6 with: python eval.py", 6),
    ({"sim": b"\x89PNG\x00\xff garbage"}, "sim_4.csv is not a readable CSV", 5),
    ({"ev": "dataset,dct,test_auc\nmovielens,none,0.7\n"}, "eval_4.csv is not a sharding results file (no column 'alg')",
     6),
    ({"ev": ""}, "eval_4.csv is not a readable CSV", 6),
    ({"meta": "{cut"}, "sim_4.csv.meta.json is missing or damaged (JSONDecodeError)", 5),
], ids=["sim-missing", "eval-missing", "sim-garbage", "eval-other-kind", "eval-empty", "meta-damaged"])
def test_bad_results_files_name_the_command_that_writes_them(tmp_path, kw, fragment, step):
    cfg, steps = _work(tmp_path, **kw)
    with pytest.raises(UserError) as e:
        report_step(cfg, steps)
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg
    command = msg.split("with: ")[1]
    script, *args = shlex.split(command)[1:]
    cls = EvalSimConfig if step == 5 else EvalConfig
    parsed = config_from_args(cls, step_parser(cls).parse_args(args))
    want = next(s for s in steps if s.name.startswith(str(step)) and s.command == command)
    assert parsed.results_csv == str(want.outputs[0])  # the command writes exactly the named file


def test_results_with_garbage_values_are_answered_with_both_commands(tmp_path):
    cfg, steps = _work(tmp_path, ev="alg,task,oom,cost_ms,search_s,sim_cost_ms\nneuroshard,0,False,abc,x,y\n")
    with pytest.raises(UserError, match=r"cannot be summarised .*rerun step 5: python eval_simulator.py .*; step 6: "
                                        r"python eval.py"):
        report_step(cfg, steps)
