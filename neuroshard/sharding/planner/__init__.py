"""`NeuroShardPlanner` and its components, in the shape of TorchRec's planner (`torchrec/distributed/planner/`)."""
from ..search import Placements, ShardTable
from .enumerators import EmbeddingBagEnumerator
from .estimators import NeuralPerfModel
from .partitioners import GridSearchPartitioner
from .planners import NeuroShardPlanner
from .proposers import BeamSplitProposer
from .stats import NeuroShardStats
from .types import (Enumeration, Enumerator, Partitioner, PerfModel, PlannedTable, PlannerResult, Proposer,
                    Stats)

__all__ = ["NeuroShardPlanner", "EmbeddingBagEnumerator", "NeuralPerfModel", "BeamSplitProposer",
           "GridSearchPartitioner", "NeuroShardStats", "Enumeration", "Enumerator", "Partitioner", "PerfModel",
           "PlannedTable", "PlannerResult", "Proposer", "Stats", "Placements", "ShardTable"]
