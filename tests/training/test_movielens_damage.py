"""MovieLens files under damage: every bad file gets one line naming the file and the line (a cut last
line is refused, never used), and intact small files give the features computed by hand."""
import re

import pytest

from neuroshard.core.errors import UserError
from neuroshard.training.data import load_movielens

INTER = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
USER = "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
ITEM = "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
GOOD = {
    "ml-100k.inter": INTER + "1\t10\t5\t300\n2\t10\t3\t100\n1\t11\t4\t200\n2\t12\t1\t400\n1\t12\t2\t500\n",
    "ml-100k.user": USER + "1\t24\tM\ttechnician\t85711\n2\t53\tF\tother\t94043\n",
    "ml-100k.item": ITEM + "10\tToy Story\t1995\tAnimation Comedy\n11\tHeat\t1995\tAction\n12\tOld\tunknown\tDrama\n",
}


def _dir(tmp_path, **change):
    for name, text in {**GOOD, **{k.replace("_", "-", 1).replace("_", "."): v for k, v in change.items()}}.items():
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return tmp_path


def test_small_files_give_the_features_by_hand(tmp_path):
    d = load_movielens(data_dir=_dir(tmp_path))
    assert d.num_samples == 5 and d.num_train == 4
    # time order: (2,10,3,100) (1,11,4,200) (1,10,5,300) (2,12,1,400) | (1,12,2,500)
    assert d.labels.tolist() == [0, 1, 1, 0, 0]
    assert d.ids[0].tolist() == [1, 0, 0, 1, 0] and d.ids[1].tolist() == [0, 1, 0, 2, 2]
    assert d.num_rows[:2] == [2, 3]
    assert d.dense[:, 2].tolist() == pytest.approx([0.53, 0.24, 0.24, 0.53, 0.24])
    assert d.dense[3:, 3].tolist() == pytest.approx([0.9, 0.9])  # unknown year -> 1990


BAD = [
    ({"ml_100k_inter": INTER + "1\t10\t5\t300\n2\t10\t3\t1"}, "ml-100k.inter line 3: the last line is cut"),
    ({"ml_100k_user": USER + "1\t24\tM\ttechnician\t85711\n2\t53\tF\tot"}, "ml-100k.user line 3: the last line is cut"),
    ({"ml_100k_inter": INTER}, "ml-100k.inter holds a header but no data lines"),
    ({"ml_100k_inter": ""}, "ml-100k.inter is empty"),
    ({"ml_100k_inter": b"\x89PNG\r\n\x1a\n\x00\x00garbage\n"}, "ml-100k.inter line 1: not UTF-8 text (byte 0x89)"),
    ({"ml_100k_inter": "lorem ipsum\ndolor\n"}, "ml-100k.inter line 1: the header lacks column 'user_id'"),
    ({"ml_100k_inter": INTER + "1\t10\t5\t300\n2\t10\t3\n"}, "ml-100k.inter line 3: 3 tab-separated fields"),
    ({"ml_100k_inter": INTER + "1\t10\t5\t300\n9\t10\t3\t100\n"}, "ml-100k.inter line 3: unknown user_id '9'"),
    ({"ml_100k_inter": INTER + "1\t10\tgood\t300\n"}, "ml-100k.inter line 2: rating must be a number from 0 to 5, got 'good'"),
    ({"ml_100k_inter": INTER + "1\t10\tnan\t300\n"}, "ml-100k.inter line 2: rating must be a number"),
    ({"ml_100k_inter": INTER + "1\t10\t1e9\t300\n"}, "line 2: rating must be a number from 0 to 5"),
    ({"ml_100k_inter": INTER + "1\t10\t-inf\t300\n"}, "line 2: rating must be a number"),
    ({"ml_100k_inter": INTER + "1\t10\t4\tyesterday\n"}, "line 2: timestamp must be a number"),
    ({"ml_100k_inter": INTER + "1\t10\t4\t1" + "0" * 400 + "\n"}, "line 2: timestamp must be a number"),
    ({"ml_100k_user": USER + "1\t24\tM\ttechnician\t85711\n1\t30\tF\tother\t1\n"}, "ml-100k.user line 3: user_id '1' appears twice"),
    ({"ml_100k_user": USER + "1\tforty\tM\ttechnician\t85711\n2\t53\tF\tother\t94043\n"}, "ml-100k.user line 2: age must be"),
    ({"ml_100k_user": USER + "1\t24.5\tM\ttechnician\t85711\n2\t53\tF\tother\t94043\n"}, "ml-100k.user line 2: age must be a whole number"),
    ({"ml_100k_item": ITEM + "10\tToy\t1995\tA\n11\tHeat\n"}, "ml-100k.item line 3: 2 tab-separated fields"),
    ({"ml_100k_item": "item_id:token\n10\n"}, "ml-100k.item line 1: the header lacks column 'release_year'"),
]


@pytest.mark.parametrize("change,fragment", BAD, ids=range(len(BAD)))
def test_damaged_files_get_one_line_naming_file_and_line(tmp_path, change, fragment):
    with pytest.raises(UserError) as e:
        load_movielens(data_dir=_dir(tmp_path, **change))
    assert fragment in str(e.value) and "\n" not in str(e.value) and "reinstall recbole" in str(e.value)


def test_a_missing_file_is_named(tmp_path):
    _dir(tmp_path)
    (tmp_path / "ml-100k.user").unlink()
    with pytest.raises(UserError, match="MovieLens file not found: .*ml-100k.user"):
        load_movielens(data_dir=tmp_path)


# ----------------------------------------------------------------------------- training refuses before it starts

def _train(tmp_path, results_csv=None, batch_size=2):
    from neuroshard.training.train import TrainConfig, train_dlrm

    (tmp_path / "ml").mkdir()
    data = load_movielens(data_dir=_dir(tmp_path / "ml"))
    cfg = TrainConfig(ndevices=2, steps=2, batch_size=batch_size)
    return train_dlrm(cfg, results_csv=results_csv, progress=False, data=data)


def test_a_batch_larger_than_the_training_set_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"--batch_size 6 is more than the 4 training samples of movielens; pass "
                                        "--batch_size 4 or less"):
        _train(tmp_path, batch_size=6)


@pytest.mark.parametrize("content,fragment", [
    ("alg,task,cost_ms\nneuroshard,0,1.5\n", "is not a training results file (no column 'dataset')"),
    (b"\x00\xff\xfe binary \x00", "is not a readable CSV"),
    ('dataset,dct,test_auc\n"movielens,none,0.7\n', "is not a readable CSV"),
], ids=["eval-results", "binary", "open-quote"])
def test_a_results_csv_of_another_kind_or_unreadable_is_refused_before_training(tmp_path, content, fragment):
    out = tmp_path / "results.csv"
    out.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = out.read_bytes()
    with pytest.raises(UserError, match=re.escape(fragment)):
        _train(tmp_path, results_csv=out, batch_size=6)  # refused by the file check, before the batch check
    assert out.read_bytes() == before


def test_synthetic_training_data_is_bounded_before_it_is_made():
    from neuroshard.training.data import SYNTHETIC_MAX_LOOKUPS, make_synthetic

    with pytest.raises(UserError, match=r"--num_samples 100,000,000 would synthesise about 3,600 M ids .* budget of "
                                        r"200 M; pass --num_samples 5,555,555 or fewer"):
        make_synthetic(100_000_000)
    assert SYNTHETIC_MAX_LOOKUPS == 200_000_000
    assert make_synthetic(2000, max_rows=1000).num_samples == 2000
