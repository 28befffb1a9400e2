"""Ensemble members (`models/ensemble.py`, train_ensemble.py): trained on resamples, found beside the pre-trained
models, refused where they do not belong to them."""
import shutil

import numpy as np
import pytest
import torch

from neuroshard.core.errors import UserError
from neuroshard.models.cost_models import ComputeCostModel
from neuroshard.models.ensemble import member_dir
from neuroshard.sharding.simulator import Simulator

from conftest import refused, run_here
from test_cost_models import _linear_compute_data

SCRIPT = "train_ensemble.py"


def test_a_bootstrap_member_is_its_own_model_and_the_same_on_a_rerun():
    feats, mask, y = _linear_compute_data(300)
    weights = {}
    for name, boot in (("plain", 0), ("b1", 1), ("b1 again", 1), ("b2", 2)):
        m = ComputeCostModel()
        m.fit((feats, mask), y, epochs=5, batch_size=64, seed=0, progress=False, bootstrap=boot)
        weights[name] = torch.cat([p.detach().ravel() for p in m.net.parameters()])
    assert torch.equal(weights["b1"], weights["b1 again"])
    assert not torch.equal(weights["b1"], weights["plain"]) and not torch.equal(weights["b1"], weights["b2"])


@pytest.fixture()
def work(tiny_pipeline, tmp_path):
    """A copy of the tiny pipeline's run (2 devices, its 5 members removed)."""
    shutil.copytree(tiny_pipeline.work, tmp_path, dirs_exist_ok=True)
    shutil.rmtree(tmp_path / "models/ensemble")
    return tmp_path


def args(work, *extra):
    return ("--data_dir", str(work / "data/cost_data"), "--dataset_dir", str(work / "data/dlrm_datasets"),
            "--models_dir", str(work / "models"), "--ndevices", "2", "--epochs", "2", *extra)


def test_members_are_trained_beside_the_models_and_loaded_with_them(work, capsys):
    done = run_here(capsys, SCRIPT, *args(work, "--members", "2"))
    assert done.returncode == 0, done.stderr
    assert "saved 2 ensemble members" in done.stdout
    sim = Simulator.from_files(work / "models", 2)
    assert len(sim.members) == 2 and all(m.inp is not None for m in sim.members)
    # each member is its own resample, and the pre-trained models are untouched by it
    w = [torch.cat([p.ravel() for p in m.compute.net.parameters()]) for m in (sim, *sim.members)]
    assert not torch.equal(w[1], w[2]) and not torch.equal(w[0], w[1])
    assert sim.members[1].compute.meta["provenance"]["bootstrap"] == 2
    # a rerun keeps what is there; a member removed is trained again
    (member_dir(work / "models", 2) / "comm_2_fw.pt").unlink()
    again = run_here(capsys, SCRIPT, *args(work, "--members", "2"))
    assert again.returncode == 0 and again.stdout.count("saved") == 3, again.stdout  # fw + bw, and the summary
    # the step cost's members score with the input-distribution model they were trained with
    assert Simulator.from_files(work / "models", 2).with_cost("step").members[0].cost == "step"


def test_members_that_do_not_belong_to_the_models_are_refused(work, capsys):
    assert run_here(capsys, SCRIPT, *args(work, "--members", "2")).returncode == 0
    b2 = member_dir(work / "models", 2)
    m = torch.load(b2 / "compute.pt", weights_only=True)
    m["meta"]["dataset_fingerprint"] = "another"
    torch.save(m, b2 / "compute.pt")
    with pytest.raises(UserError, match=r"the ensemble member in .*b2 was trained on other cost data than the models "
                                        r"beside it \(its dataset_fingerprint differs\); delete .*ensemble and train"):
        Simulator.from_files(work / "models", 2)
    (b2 / "compute.pt").write_bytes(b"not a model")
    with pytest.raises(UserError, match=r".*b2/compute\.pt"):
        Simulator.from_files(work / "models", 2)
    (b2 / "comm_2_input.pt").unlink()
    shutil.copy(member_dir(work / "models", 1) / "compute.pt", b2 / "compute.pt")
    with pytest.raises(UserError, match="lacks an input-distribution model"):
        Simulator.from_files(work / "models", 2)
    # members without models for these devices: no ensemble, and the risk search says how to make one
    shutil.rmtree(work / "models/ensemble")
    (work / "models/ensemble/b1").mkdir(parents=True)
    assert Simulator.from_files(work / "models", 2).members == ()


def test_bad_arguments_are_refused_in_one_line(work, capsys, tmp_path_factory):
    empty = tmp_path_factory.mktemp("empty")
    refused(capsys, SCRIPT, *args(work, "--members", "1"), match=r"error: --members must be .*2.*100.*, got 1",
            untouched=[work])
    refused(capsys, SCRIPT, "--models_dir", str(empty), "--data_dir", str(work / "data/cost_data"),
            match=r"error: .*compute\.pt is missing; the members are trained beside the pre-trained models: train "
                  r"them first .*", untouched=[empty])
    refused(capsys, SCRIPT, *args(work, "--bootstrap", "-1"), match=r"error: --bootstrap must be .*, got -1",
            untouched=[work])
    refused(capsys, "eval_simulator.py", "--data_dir", str(work / "data/dlrm_datasets"), "--task_path",
            str(work / "data/tasks/test.pkl"), "--ndevices", "2", "--max_mem", "0.01", "--alg", "neuroshard_risk",
            "--results_csv", str(work / "r.csv"), cwd=work,
            match=r"error: --alg neuroshard_risk needs the cost models' ensemble members .*train_ensemble\.py "
                  r"--ndevices 2.*", untouched=[work])


def test_alg_all_without_members_leaves_the_risk_search_out_and_says_so(work, capsys):
    """Models trained before the ensemble existed still run `--alg all`; named by itself, the risk search is refused
    (test_bad_arguments_are_refused_in_one_line)."""
    done = run_here(capsys, "eval_simulator.py", "--data_dir", str(work / "data/dlrm_datasets"), "--task_path",
                    str(work / "data/tasks/test.pkl"), "--ndevices", "2", "--max_mem", "0.01", "--alg", "all",
                    "--results_csv", str(work / "r.csv"), cwd=work)
    assert done.returncode == 0, done.stderr
    assert "note: --alg all leaves out neuroshard_risk" in done.stdout
    algs = {line.split(",")[1] for line in (work / "r.csv").read_text().splitlines()[1:]}
    assert "neuroshard" in algs and "neuroshard_risk" not in algs
