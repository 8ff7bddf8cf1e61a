"""Relax quantization passes and the integer arithmetic they share."""
