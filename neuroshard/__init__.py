"""neuroshard: embedding-table sharding with pre-trained neural cost models (NeuroShard, MLSys 2023).

`neuroshard.NeuroShardPlanner` is TorchRec's planner interface with NeuroShard's search
(`neuroshard.sharding.planner`); it is imported on first use, so `import neuroshard`
does not import TorchRec.
"""
__version__ = "0.1.0"
__all__ = ["NeuroShardPlanner"]


def __getattr__(name: str):
    if name == "NeuroShardPlanner":
        from .sharding.planner import NeuroShardPlanner

        return NeuroShardPlanner
    raise AttributeError(f"module 'neuroshard' has no attribute {name!r}")
