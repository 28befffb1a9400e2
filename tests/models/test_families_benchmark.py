"""benchmarks/families.py --repeat_dir: the Spearman between two collections of the same shards."""
import numpy as np
import pytest

from conftest import load_script
from neuroshard.core.errors import UserError

families = load_script("benchmarks/families.py")
repeat_spearman = families.repeat_spearman


def _samples(costs, fams):
    return [{"index": i, "family": f, "table_ids": np.array([i, i + 1]), "dims": np.array([16, 8]), "cost_ms": c}
            for i, (c, f) in enumerate(zip(costs, fams))]


def test_repeat_spearman_per_family_and_overall():
    fams = ["a"] * 4 + ["b"] * 4
    first = _samples([1, 2, 3, 4, 10, 20, 30, 40], fams)
    again = _samples([1.1, 2.2, 3.1, 4.3, 40, 30, 20, 10], fams)   # a keeps its order, b reverses it
    got = repeat_spearman(first, again, np.array(fams))
    assert got["a"] == pytest.approx(1.0) and got["b"] == pytest.approx(-1.0)
    assert -1 < got["all"] < 1
    assert set(repeat_spearman(first, again[:2], np.array(fams))) == set()  # fewer than 3 pairs: nothing


def test_a_repeat_of_other_shards_is_refused():
    fams = ["a"] * 4
    first, again = _samples([1, 2, 3, 4], fams), _samples([1, 2, 3, 4], fams)
    again[2]["dims"] = np.array([16, 16])
    with pytest.raises(UserError, match="sample 2 is another shard"):
        repeat_spearman(first, again, np.array(fams))


def test_a_damaged_cost_file_is_refused_with_a_salvage_the_script_takes(tmp_path):
    """The common damaged-file message names --salvage, so the script must take it and then read past it."""
    from neuroshard.core.artifacts import RecordLog
    from neuroshard.hardware.compute_bench import COMPUTE_DATA_KIND

    path = tmp_path / "compute_cost_data.pkl"
    with RecordLog(path, COMPUTE_DATA_KIND, {"device": "cpu"}, ()) as log:
        for i in range(6):
            log.append({"index": i, "table_ids": [i], "dims": [4], "cost_ms": 1.0})
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))
    args = ["--data_dir", str(tmp_path), "--dataset_dir", str(tmp_path / "no_dataset"), "--out_dir", str(tmp_path)]
    with pytest.raises(UserError, match=r"is damaged .*rerun with --salvage to keep the 5 good"):
        families.main(args)
    with pytest.raises(UserError) as e:  # past the damaged record: now the missing dataset is what is refused
        families.main(args + ["--salvage"])
    assert "is damaged" not in str(e.value) and "no_dataset" in str(e.value)
