"""benchmarks/engine_comm_data.py refuses added samples that are not the run's kind of all-to-all, before measuring."""
from conftest import refused


def test_added_samples_of_another_kind_are_refused(tiny_pipeline, tmp_path, capsys):
    work = tiny_pipeline.work
    refused(capsys, "benchmarks/engine_comm_data.py", "--work_dir", str(work), "--ndevices", "2", "--max_mem", "0.01",
            "--extra_comm_data", str(work / "data/cost_data/comm_cost_data_2_input.pkl"),
            "--out_csv", str(tmp_path / "out.csv"), untouched=[tmp_path],
            match=r"error: .*comm_cost_data_2_input\.pkl holds other all-to-all samples than the run's comm cost data "
                  r"\(devices, batch, mp_keep or input distribution\); collect them with collect_comm_cost_data\.py "
                  r"and the run's --ndevices and batch")
