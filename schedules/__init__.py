"""Tuning records shipped with tvm-lowprec: data, one MetaSchedule JSON database per target row."""
