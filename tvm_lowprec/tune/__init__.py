"""MetaSchedule tuning of the integer kernels, with records ``compile(..., database=...)`` applies."""

from .space import default_schedule, qgemm_space, qgemm_spaces, space_generator
from .tuner import (COST_MODELS, Task, TaskResult, TuningDatabaseError, TuningError, TuningResult, export_best, extract_tasks,
                    open_database, rpc_runner, tune, untunable_kernels)

__all__ = ["COST_MODELS", "Task", "TaskResult", "TuningDatabaseError", "TuningError", "TuningResult", "default_schedule",
           "export_best", "extract_tasks", "open_database", "qgemm_space", "qgemm_spaces", "rpc_runner", "space_generator", "tune",
           "untunable_kernels"]
