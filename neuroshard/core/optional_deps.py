"""TorchRec, the one optional dependency: `require_torchrec()` is the one line a user gets where it is missing.

TorchRec is imported only where a feature needs it (its baseline planner, `NeuroShardPlanner`, the export of a
plan to TorchRec, measuring TorchRec's step), so `import neuroshard` and every other path run without it.
"""
from __future__ import annotations

import logging

from .errors import UserError

INSTALL_HINT = ("TorchRec is not installed; install it without replacing torch: "
                "pip install --no-deps torchrec==1.9.2 && pip install -c constraints.txt tensordict "
                "torchmetrics==1.0.3 iopath pyre-extensions typing-inspect lightning-utilities (make setup does this)")


def require_torchrec() -> None:
    """Import the parts of TorchRec this package uses, or raise one `UserError` that says how to install it (an
    import error deep inside TorchRec or fbgemm is named in a few words, not as a traceback). TorchRec's own
    logging is quieted to errors."""
    try:
        import torchrec  # noqa: F401
        from torchrec.distributed.embedding_types import EmbeddingComputeKernel  # noqa: F401
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: F401
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology  # noqa: F401
        from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR  # noqa: F401
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator  # noqa: F401
        from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory  # noqa: F401
        from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation  # noqa: F401
        from torchrec.distributed.planner.types import Storage  # noqa: F401
        from torchrec.distributed.types import ShardingType  # noqa: F401
        from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: F401
        from torchrec.modules.embedding_modules import EmbeddingBagCollection  # noqa: F401
    except Exception as e:
        raise UserError(f"{INSTALL_HINT} ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]})") from None
    logging.getLogger("torchrec").setLevel(logging.ERROR)
