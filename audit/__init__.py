"""dpfl-audit orchestration: CLI, configuration, datasets, partitions, models, run store, pipeline.

The heavy modules are imported lazily by the CLI so that ``dpfl-audit --help`` stays fast.
"""

__version__ = "0.1.0"
