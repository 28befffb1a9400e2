"""The user's planning path: shard_tables (plan_tables), calibration on the user's hardware, measuring candidate plans."""
