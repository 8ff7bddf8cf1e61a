"""argparse types shared by the benchmark scripts."""

from __future__ import annotations

import argparse


def parse_threads(text: str) -> list[int]:
    """``"1,2"`` -> ``[1, 2]``; every count at least 1."""
    try:
        threads = [int(t) for t in text.split(",") if t.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"bad thread list {text!r}: {err}") from None
    if not threads or min(threads) < 1:
        raise argparse.ArgumentTypeError(f"thread counts must be >= 1: {text!r}")
    return threads


def names_parser(known, what: str):
    """An argparse type for a comma-separated list of names out of ``known``."""

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {what}(s) {unknown or text!r}; known: {', '.join(known)}")
        return names

    return parse


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"1x768x3072,256x256x256"`` -> ``[(1, 768, 3072), (256, 256, 256)]`` (M x N x K)."""
    shapes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        dims = item.lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise argparse.ArgumentTypeError(f"bad shape {item!r}; expected MxNxK with positive integers")
        shapes.append(tuple(int(d) for d in dims))
    return shapes
