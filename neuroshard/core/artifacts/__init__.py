"""Artifacts on disk, one module per concern; the names every caller uses are importable from here.

- `pickles`: pickles that cannot run code (`encode`/`decode`, `SafeUnpickler`, `load_pickle`) and model weights
  read as tensors only (`load_torch`);
- `inputs`: input files checked before they are read (`check_input_file`), and the one text/JSON reader
  (`read_text`, `read_json`: one size limit, one set of messages; `json_real`, a number read from it);
- `atomic`: atomic writes (`atomic_write_*`, `atomic_torch_save`) and the checks and locks of a run's outputs
  (`check_outputs`, `OutputLock`);
- `record_log`: the append-only, checksummed `RecordLog` of the collectors and eval.py;
- `provenance`: how an artifact was made (`provenance`, `source_digest`, `file_digest`), and `content_digest`, the
  digest a file keeps of what it says;
- `results_writer`: the one results writer (`write_results`), the one JSON writer (`write_json`, `json_text`: strict JSON,
  non-finite numbers as null) and the check of a results CSV (`check_results_csv`).
"""
from .atomic import (OutputLock, atomic_torch_save, atomic_write_bytes, atomic_write_pickle, atomic_write_text,
                     check_output_dir, check_output_file, check_outputs, check_printable_path,
                     check_writable_file)
from .inputs import MAX_TEXT_BYTES, READ_FIX, check_input_file, json_real, read_json, read_text
from .pickles import (SafeUnpickler, decode, encode, load_pickle, load_torch, torch_load_failure, torch_load_plain,
                      written_by)
from .provenance import FORMAT_VERSION, content_digest, cpu_name, file_digest, provenance, source_digest, versions
from .record_log import (FRAME_MAGIC, ParsedLog, RecordLog, deferred_interrupts, frame, fresh_path, parse_record_log,
                         read_record_log)
from .results_writer import check_results_csv, json_text, write_json, write_results

__all__ = ["OutputLock", "cpu_name", "atomic_torch_save", "atomic_write_bytes", "atomic_write_pickle", "atomic_write_text",
           "check_output_dir", "check_output_file", "check_outputs", "check_printable_path", "check_writable_file", "MAX_TEXT_BYTES",
           "READ_FIX", "check_input_file", "json_real", "read_json", "read_text", "SafeUnpickler", "decode", "encode",
           "load_pickle", "load_torch", "torch_load_failure", "torch_load_plain", "written_by", "FORMAT_VERSION", "content_digest", "file_digest", "provenance", "source_digest", "versions",
           "FRAME_MAGIC", "ParsedLog", "RecordLog", "deferred_interrupts", "frame", "fresh_path", "parse_record_log",
           "read_record_log", "check_results_csv", "json_text", "write_json", "write_results"]
