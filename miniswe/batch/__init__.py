"""Batch runs: a task list through a pool of workers (threads, or a Ray cluster), one `run_task` per task, into a
resumable run directory.

Entry points: `run.run_batch`, `report.build_report`, `merge.merge_runs`; the CLI imports them lazily.
"""
