"""neuroshard: embedding-table sharding with pre-trained neural cost models (NeuroShard, MLSys 2023)."""
__version__ = "0.1.0"
