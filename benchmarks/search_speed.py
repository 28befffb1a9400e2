"""Planning speed: `NeuroShardPlanner` against TorchRec's `EmbeddingShardingPlanner`, constructor and `plan`, paired
and interleaved, NeuroShardPlanner twice: its search alone (`cost="paper", compare=False`: `neuroshard`) and as a user
calls it, with its defaults (the step cost, TorchRec's storage reservation, TorchRec's own plan and the heuristics'
compared: `neuroshard_as_called`), on TorchRec modules of 10, 30 and 60 tables on 4 and 8 ranks and of the DLRM dataset's 856
tables on 16 ranks; then the bare search (`neuroshard_search`) on the pipeline's tasks. Run by hand:

    python benchmarks/search_speed.py [--reps 7] [--reps_856 3] [--models_dir models] [--out_dir results]

Small modules: dims 16-128, rows 1k-40k, pooling factors 1-30, 0.5 GB of DDR
per rank, batch 512 per rank, CPU topology. The 856-table module: the synthetic DLRM generator's rows
(x `--row_scale_856`) and pooling factors (the published dataset's statistics), dims 16-128, 4 GB of DDR
per rank. Both planners see the same module and `ParameterConstraints` (pooling factors); each round builds
each planner anew and times its constructor and one `plan`, in alternating order (a user's call: a planner planning
again reuses its enumerator's estimates); the paired ratio is NeuroShard / TorchRec per round, with the geometric
mean and a 95% bootstrap interval (`experiments.paired.paired`). Cost models: `--models_dir`'s for N ranks
when present, else the real network shapes with random weights (the planning time depends on the shapes,
not the weights; the output says which). Writes `<out_dir>/search_speed.csv` (one row per planner and
round), `search_speed.md`, `search_speed.json` (summary), provenance in `.meta.json` and `search_speed.png` (planning time
against table count).
"""
from __future__ import annotations

import io
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard import NeuroShardPlanner  # noqa: E402
from neuroshard.core.artifacts import atomic_write_bytes, check_output_dir, write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import flag  # noqa: E402
from neuroshard.core.errors import check_float, check_int  # noqa: E402
from neuroshard.core.optional_deps import require_torchrec  # noqa: E402
from neuroshard.core.tables import format_table  # noqa: E402
from neuroshard.core.costs import Cluster  # noqa: E402
from neuroshard.data.dataset import DLRMDataset  # noqa: E402
from neuroshard.data.synthetic import SyntheticConfig, synthetic_table_stats  # noqa: E402
from neuroshard.data.tasks import load_tasks  # noqa: E402
from neuroshard.experiments.pipeline import PRESETS  # noqa: E402
from neuroshard.experiments.paired import paired  # noqa: E402
from neuroshard.models.cost_models import CommCostModel, ComputeCostModel  # noqa: E402
from neuroshard.models.loading import cost_model_paths  # noqa: E402
from neuroshard.sharding.search import neuroshard_search  # noqa: E402
from neuroshard.sharding.simulator import Simulator  # noqa: E402

SMALL_TABLES = (10, 30, 60)
PLANNERS = ("neuroshard", "neuroshard_as_called", "torchrec")
LARGE = (856, 16)
DIMS = (16, 32, 64, 128)


@dataclass
class SearchSpeedConfig:
    """Planning speed of NeuroShardPlanner against TorchRec's planner (benchmarks/search_speed.py)."""

    reps: int = flag(7, "paired rounds of each small module (10-60 tables)")
    reps_856: int = flag(3, "paired rounds of the 856-table module (TorchRec's planner takes minutes a round)")
    skip_856: bool = flag(False, "leave out the 856-table module")
    small_ranks: tuple[int, ...] = flag((4, 8), "rank counts of the 10-60 table modules (the planner as called needs "
                                        "trained models for each: random weights may predict negative costs)",
                                        parse="int_list")
    row_scale_856: float = flag(0.01, "rows of the 856 synthetic DLRM tables x this (the quick preset's scale)")
    models_dir: str = flag("models", "compute.pt and comm_<N>_{fw,bw}.pt; random weights where missing")
    data_dir: str = flag("data/dlrm_datasets", "the pipeline's dataset, for the bare search on its tasks")
    tasks: str = flag("data/tasks/test.pkl", "the pipeline's test tasks for the bare search (skipped if absent)")
    ndevices: int = flag(PRESETS["quick"].ndevices[0], "devices of the bare search (the quick preset's)")
    max_mem: float = flag(PRESETS["quick"].max_mem, "GB per device of the bare search (the quick preset's)")
    out_dir: str = flag("results", "where search_speed.csv, .md and .png go")
    seed: int = flag(0, "seed of the modules' tables")

    def check(self) -> "SearchSpeedConfig":
        check_int("--reps", self.reps, 2, 1000)
        check_int("--reps_856", self.reps_856, 2, 1000)
        check_int("--seed", self.seed, 0, 2**32 - 1)
        for n in self.small_ranks:
            check_int("--small_ranks", n, 2, 64)
        check_float("--row_scale_856", self.row_scale_856, 1e-6, 1.0)
        check_int("--ndevices", self.ndevices, 2, 1024)
        check_float("--max_mem", self.max_mem, 0.0, 1e6, lo_open=True)
        return self


def simulator(n: int, models_dir: Path):
    """The models for n ranks from `models_dir`, else the real shapes with random weights; and which it is."""
    trained = Simulator.from_files(models_dir, n, required=False)
    if trained is not None:
        return trained, "trained"
    torch.manual_seed(n)
    compute = ComputeCostModel({"device": "cpu", "input_transform": "log"})
    return Simulator(compute, CommCostModel(n, "fw", {"device": "cpu"}), CommCostModel(n, "bw", {"device": "cpu"})), \
        "random weights"


def save_models(sim, folder: Path, n: int) -> Path:
    """The simulator's models as files, for NeuroShardPlanner (which loads them itself)."""
    folder.mkdir(parents=True, exist_ok=True)
    compute, fw, bw = cost_model_paths(folder, n)
    sim.compute.save(compute)
    sim.fw.save(fw)
    sim.bw.save(bw)
    return folder


def module_tables(T: int, rng, cfg: SearchSpeedConfig) -> list[tuple[str, int, int, float]]:
    """(name, rows, dim, pooling factor) of a benchmark module's tables."""
    dims = rng.choice(DIMS, T)
    if T == LARGE[0]:
        rows, pooling = synthetic_table_stats(SyntheticConfig(num_tables=T, seed=cfg.seed,
                                                              row_scale=cfg.row_scale_856))
        rows = np.maximum(rows, 1)
    else:
        rows, pooling = rng.integers(1_000, 40_001, T), rng.uniform(1.0, 30.0, T)
    return [(f"t{i}", int(rows[i]), int(dims[i]), float(pooling[i])) for i in range(T)]


def module_and_inputs(tables, n: int):
    """The TorchRec module of `tables` (meta device), its `ParameterConstraints` (pooling factors) and topology."""
    from torchrec.distributed.planner import ParameterConstraints, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=t, embedding_dim=d, num_embeddings=r,
                                                            feature_names=[t]) for t, r, d, _ in tables],
                                 device=torch.device("meta"))
    constraints = {t: ParameterConstraints(pooling_factors=[pf]) for t, _, _, pf in tables}
    topology = Topology(world_size=n, compute_device="cpu", ddr_cap=int((4 if len(tables) == LARGE[0] else 0.5) * 2**30))
    return ebc, constraints, topology


def new_planner(name: str, topology, constraints: dict, models: Path):
    """A new planner `name` (PLANNERS) for this topology and these constraints, as a user constructs it."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    if name == "torchrec":
        return EmbeddingShardingPlanner(topology=topology, batch_size=512, constraints=constraints, debug=False)
    if name == "neuroshard":  # the search alone, on the paper's cost: by default the planner also runs TorchRec's
        # planner and the heuristics to compare their plans, which would add TorchRec's planning time to NeuroShard's
        return NeuroShardPlanner(topology, batch_size=512, constraints=constraints, models_dir=models, debug=False,
                                 cost="paper", compare=False)
    return NeuroShardPlanner(topology, batch_size=512, constraints=constraints, models_dir=models, debug=False)


def time_pairs(cases, reps_of, out: Path, cfg) -> list[dict]:
    """Each round builds each planner anew and times its constructor and `plan`, as a user's call runs: one planner
    planning the same module again is not what is timed (TorchRec's enumerator keeps its estimates between the
    calls of one planner, which makes its later calls about 20-30% faster here)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    # TorchRec's planner warns of its default storage reservation (the default of both planners here) at every
    # construction, in every forked call too: said once here instead
    print("note: both planners use TorchRec's default storage reservation (HeuristicalStorageReservation, 15%), "
          "whose FutureWarning is left out")
    warnings.filterwarnings("ignore", message="HeuristicalStorageReservation", category=FutureWarning)
    sharders = [EmbeddingBagCollectionSharder()]
    rows, rng = [], np.random.default_rng(cfg.seed)
    built = []
    for T, n in cases:
        sim, kind = simulator(n, Path(cfg.models_dir))
        models = Path(cfg.models_dir) if kind == "trained" else save_models(sim, out / "search_speed_models" / str(n), n)
        built.append((T, n, kind, models, *module_and_inputs(module_tables(T, rng, cfg), n)))
    rounds = max(reps_of(T) for T, _ in cases)
    with tqdm(total=sum(len(PLANNERS) * reps_of(T) for T, _ in cases), desc="plan (interleaved)") as bar:
        for rep in range(rounds):
            for T, n, kind, models, ebc, constraints, topology in built:
                if rep >= reps_of(T):
                    continue
                for name in PLANNERS[:: 1 if rep % 2 == 0 else -1]:
                    t0 = time.perf_counter()
                    new_planner(name, topology, constraints, models).plan(ebc, sharders)
                    rows.append({"planner": name, "tables": T, "ranks": n, "round": rep, "models": kind,
                                 "seconds": time.perf_counter() - t0})
                    bar.update(1)
    return rows


def bare_search(cfg) -> list[dict]:
    """neuroshard_search on each of the pipeline's tasks (its own cost models), one call per task."""
    if not Path(cfg.tasks).is_file() or not Path(cfg.data_dir).is_dir():
        print(f"bare search skipped: no {cfg.tasks} (run the pipeline first: make reproduce)")
        return []
    n, mem = cfg.ndevices, cfg.max_mem
    sim, kind = simulator(n, Path(cfg.models_dir))
    out = []
    for i, task in enumerate(load_tasks(cfg.tasks, DLRMDataset.load(cfg.data_dir))):
        t0 = time.perf_counter()
        neuroshard_search(sim, task, Cluster(n, mem))
        out.append({"task": i, "tables": task.num_tables, "ranks": n, "models": kind,
                    "seconds": time.perf_counter() - t0})
    return out


def report(rows: list[dict], bare: list[dict]) -> tuple[str, list[dict]]:
    summary = []
    for T, n in sorted({(r["tables"], r["ranks"]) for r in rows}):
        times = {p: {r["round"]: r["seconds"] for r in rows if (r["tables"], r["ranks"], r["planner"]) == (T, n, p)}
                 for p in PLANNERS}
        s, c = paired(times["neuroshard"], times["torchrec"]), paired(times["neuroshard_as_called"], times["torchrec"])
        summary.append({"tables": T, "ranks": n, "rounds": s["n"],
                        **{f"{p}_s": float(np.median(list(times[p].values()))) for p in PLANNERS},
                        "ratio": s["ratio"], "ci_lo": s["ci_lo"], "ci_hi": s["ci_hi"],
                        "as_called_ratio": c["ratio"], "as_called_ci_lo": c["ci_lo"], "as_called_ci_hi": c["ci_hi"]})
    lines = format_table(["tables", "ranks", "rounds", "search alone (s, median)", "as called (s, median)",
                          "TorchRec (s, median)", "search alone / TorchRec [95% CI]", "as called / TorchRec [95% CI]"],
                         [[s["tables"], s["ranks"], s["rounds"], f"{s['neuroshard_s']:.3f}",
                           f"{s['neuroshard_as_called_s']:.3f}", f"{s['torchrec_s']:.3f}",
                           f"{s['ratio']:.3f} [{s['ci_lo']:.3f}, {s['ci_hi']:.3f}]",
                           f"{s['as_called_ratio']:.3f} [{s['as_called_ci_lo']:.3f}, {s['as_called_ci_hi']:.3f}]"]
                          for s in summary])
    if bare:
        secs = np.array([b["seconds"] for b in bare])
        lines += ["", f"bare search on the pipeline's {len(bare)} tasks ({bare[0]['tables']}-"
                  f"{max(b['tables'] for b in bare)} tables, {bare[0]['ranks']} devices): median {np.median(secs):.3f} s, "
                  f"max {secs.max():.3f} s"]
    return "\n".join(lines) + "\n", summary


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for n, marker in zip(sorted({s["ranks"] for s in summary}), "osd^"):
        pts = [s for s in summary if s["ranks"] == n]
        for key, color, label in (("neuroshard_s", "C0", "NeuroShardPlanner's search"),
                                  ("neuroshard_as_called_s", "C2", "NeuroShardPlanner as called"),
                                  ("torchrec_s", "C1", "TorchRec")):
            ax.plot([s["tables"] for s in pts], [s[key] for s in pts], marker=marker, color=color,
                    label=f"{label} ({n} ranks)")
    ax.set(xscale="log", yscale="log", xlabel="tables", ylabel="planning time (s, median)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def main(argv=None) -> None:
    p = step_parser(SearchSpeedConfig, __doc__.split("\n\n")[0])
    cfg = config_from_args(SearchSpeedConfig, p.parse_args(argv)).check()
    out = Path(cfg.out_dir)
    check_output_dir(out, "--out_dir")
    require_torchrec()  # one line when TorchRec is missing
    cases = [(T, n) for n in cfg.small_ranks for T in SMALL_TABLES] + ([] if cfg.skip_856 else [LARGE])
    rows = time_pairs(cases, lambda T: cfg.reps_856 if T == LARGE[0] else cfg.reps, out, cfg)
    bare = bare_search(cfg)
    table, summary = report(rows, bare)
    print(table)
    write_results(out / "search_speed.csv", rows, markdown=f"# Planning speed\n\n{table}",
                  record={"summary": summary, "bare": bare}, script="benchmarks/search_speed.py", **asdict(cfg))
    plot(summary, out / "search_speed.png")
    print(f"wrote {out / 'search_speed.csv'}, .md, .json and .png")


if __name__ == "__main__":
    run_main(main)
