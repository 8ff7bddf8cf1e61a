"""MetaSchedule tuning of the integer kernels, with records ``compile(..., database=...)`` applies."""

from .space import qgemm_space, space_generator
from .tuner import Task, TuningDatabaseError, extract_tasks, open_database, tune, untunable_kernels

__all__ = ["Task", "TuningDatabaseError", "extract_tasks", "open_database", "qgemm_space", "space_generator", "tune",
           "untunable_kernels"]
