"""Earlier leftovers: --sleep_range -5,2 and 0,inf, --ndevices 1 in eval_simulator, comm samples of another
device count under an N-device file name, and cost-model training on a log with a damaged record."""
import math
import re

import pytest

from neuroshard.core.artifacts import RecordLog
from neuroshard.core.cli import step_parser
from neuroshard.core.config import CommCollectConfig, EvalSimConfig, TrainCommConfig
from neuroshard.core.errors import UserError
from neuroshard.experiments.evaluate import eval_simulator
from neuroshard.hardware.comm_bench import COMM_DATA_KIND
from neuroshard.models.fitting import train_comm_models


@pytest.mark.parametrize("pair,words", [((-5.0, 2.0), "must satisfy 0 <= lo <= hi"),
                                        ((0.0, math.inf), "must be finite numbers with 0 <= lo <= hi, got 0.0,inf (not "
                                                          "finite)"),
                                        ((math.nan, 1.0), "must be finite numbers with 0 <= lo <= hi, got nan,1.0"),
                                        ((5.0, 2.0), "must satisfy 0 <= lo <= hi")])
def test_bad_sleep_ranges_are_refused(pair, words):
    with pytest.raises(UserError, match=r"^--sleep_range " + re.escape(words)):
        CommCollectConfig(sleep_range=pair).check(2)


def test_an_infinite_sleep_range_on_the_command_line_says_not_finite(tmp_path):
    from neuroshard.core.cli import config_from_args

    with pytest.raises(UserError, match=r"got 0.0,inf \(not finite\)$"):
        config_from_args(CommCollectConfig, step_parser(CommCollectConfig).parse_args(
            ["--sleep_range", "0,inf", "--out_dir", str(tmp_path)])).check(2)


def test_a_negative_value_on_the_command_line_gets_the_way_to_write_it(capsys):
    with pytest.raises(SystemExit) as e:
        step_parser(CommCollectConfig).parse_args(["--sleep_range", "-5,2"])
    assert e.value.code == 2
    assert "--sleep_range=-5,2" in capsys.readouterr().err


def test_eval_simulator_with_one_device_names_the_real_limit(tmp_path):
    cfg = EvalSimConfig(data_dir=str(tmp_path / "nowhere"), ndevices=1, results_csv=str(tmp_path / "r.csv"))
    with pytest.raises(UserError, match=r"--ndevices must be >= 2, got 1: the simulator's communication cost models "
                                        r"exist for 2 or more devices"):
        eval_simulator(cfg)


def _comm_log(path, ndevices, n=10):
    header = {"ndevices": ndevices, "device": "cpu", "batch_size": 512}
    with RecordLog(path, COMM_DATA_KIND, header, ()) as log:
        for i in range(n):
            log.append({"index": i, "dims": [[4, 8]] * ndevices, "fw_ms": [1.0] * ndevices,
                        "bw_ms": [1.0] * ndevices})


def test_two_device_samples_under_the_four_device_name_are_refused(tmp_path):
    _comm_log(tmp_path / "comm_cost_data_4.pkl", 2)
    cfg = TrainCommConfig(data_dir=str(tmp_path), ndevices=4, fw_out_path=str(tmp_path / "fw.pt"),
                          bw_out_path=str(tmp_path / "bw.pt"))
    with pytest.raises(UserError, match=r"comm_cost_data_4.pkl holds samples of 2 devices, but its name is for 4 "
                                        r"\(--ndevices 4\); .*name the file comm_cost_data_2.pkl"):
        train_comm_models(cfg)
    assert not (tmp_path / "fw.pt").exists()


def test_training_on_a_damaged_log_refuses_then_salvages(tmp_path):
    path = tmp_path / "comm_cost_data_2.pkl"
    _comm_log(path, 2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))
    cfg = TrainCommConfig(data_dir=str(tmp_path), ndevices=2, fw_out_path=str(tmp_path / "fw.pt"),
                          bw_out_path=str(tmp_path / "bw.pt"))
    with pytest.raises(UserError, match=r"record #\d+ \(byte \d+\) is damaged .*--salvage to keep the 9 good"):
        train_comm_models(cfg)
    cfg.salvage = True  # the good 9 are kept, the damaged one dropped: now too few to train, said in one line
    with pytest.raises(UserError, match="holds 9 samples; at least 10 are needed"):
        train_comm_models(cfg)
    assert step_parser(TrainCommConfig).parse_args(["--salvage"]).salvage is True
