"""The user's planning path (`shard_tables.py`): load the tables and models, calibrate them on the user's hardware
(`calibrate.py`, `calibrated_models.py`, `calibration_file.py`), choose a plan, measure the candidates
(`measure.py`, `stop_rule.py`), write and report it (`plan_report.py`)."""
