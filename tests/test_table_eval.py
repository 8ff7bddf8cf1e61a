"""Lookup tables computed in numpy (:mod:`tvm_lowprec.quant.table_eval`) equal the tables TVM computes
by compiling the chain (:func:`~tvm_lowprec.quant.lookup_tables.compiled_tables`, the kernels' own
float operators), for every operator a chain may hold (:data:`~tvm_lowprec.quant.lookup_tables.ELEMENTWISE`),
on all 256 inputs of both 8-bit types; an operator form the evaluator does not know goes to TVM."""

import numpy as np
import pytest
from tvm import relax

from tvm_lowprec.quant import lookup_tables as L
from tvm_lowprec.quant import table_eval


def _f(value):
    return relax.const(np.float32(value), "float32")


def _chain_body(op: str, x):
    """``op`` applied to the dequantized float ``x``, in the form a chain holds it."""
    name = op.removeprefix("relax.")
    unary = {"sigmoid": relax.op.sigmoid, "tanh": relax.op.tanh, "exp": relax.op.exp, "erf": relax.op.erf,
             "nn.gelu": relax.op.nn.gelu, "nn.gelu_tanh": relax.op.nn.gelu_tanh, "nn.silu": relax.op.nn.silu,
             "nn.selu": relax.op.nn.selu, "nn.relu": relax.op.nn.relu, "negative": relax.op.negative,
             "abs": relax.op.abs, "square": relax.op.square, "sin": relax.op.sin,
             "cos": relax.op.cos, "tan": relax.op.tan, "sinh": relax.op.sinh, "cosh": relax.op.cosh,
             "atan": relax.op.atan, "asinh": relax.op.asinh}
    if name in unary:
        return unary[name](x)
    steps = {"round": relax.op.round, "floor": relax.op.floor, "ceil": relax.op.ceil, "trunc": relax.op.trunc}
    if name in steps:  # steps of 0.25
        return relax.op.multiply(steps[name](relax.op.multiply(x, _f(4.0))), _f(0.25))
    if name == "sign":
        return relax.op.add(relax.op.sign(x), x)
    positive = relax.op.add(relax.op.abs(x), _f(0.25))  # log, sqrt, acosh: a domain they accept
    unit = relax.op.multiply(relax.op.tanh(x), _f(0.99))  # asin, acos, atanh
    domain = {"log": (relax.op.log, positive), "sqrt": (relax.op.sqrt, positive), "rsqrt": (relax.op.rsqrt, positive),
              "acosh": (relax.op.acosh, relax.op.add(positive, _f(1.0))), "asin": (relax.op.asin, unit),
              "acos": (relax.op.acos, unit), "atanh": (relax.op.atanh, unit)}
    if name in domain:
        fn, arg = domain[name]
        return fn(arg)
    binary = {"add": relax.op.add, "subtract": relax.op.subtract, "multiply": relax.op.multiply,
              "divide": relax.op.divide, "maximum": relax.op.maximum, "minimum": relax.op.minimum}
    if name in binary:
        return binary[name](x, _f(0.7))
    compare = {"greater": relax.op.greater, "greater_equal": relax.op.greater_equal, "less": relax.op.less,
               "less_equal": relax.op.less_equal, "equal": relax.op.equal, "not_equal": relax.op.not_equal}
    if name in compare:
        return relax.op.where(compare[name](x, _f(0.5)), x, relax.op.multiply(x, _f(0.1)))
    if name in ("logical_not", "logical_and", "logical_or", "where"):
        a, b = relax.op.greater(x, _f(-0.5)), relax.op.less(x, _f(1.5))
        cond = {"logical_not": lambda: relax.op.logical_not(a), "logical_and": lambda: relax.op.logical_and(a, b),
                "logical_or": lambda: relax.op.logical_or(a, b), "where": lambda: a}[name]()
        return relax.op.where(cond, x, relax.op.negative(x))
    if name == "clip":
        return relax.op.clip(x, -1.5, 2.0)
    if name == "nn.leakyrelu":
        return relax.op.nn.leakyrelu(x, 0.1)
    if name == "nn.prelu":  # the chain builder rewrites a one-slope PRelu into leakyrelu
        return relax.op.nn.leakyrelu(x, 0.25)
    if name == "nn.softplus":
        return relax.op.nn.softplus(x, 1.5, 4.0)
    if name == "power":
        return relax.op.power(relax.op.abs(x), _f(1.5))
    if name == "astype":  # a float value through an integer type and back
        return relax.op.multiply(relax.op.astype(relax.op.astype(relax.op.multiply(x, _f(8.0)), "int32"), "float32"),
                                 _f(0.125))
    raise NotImplementedError(op)


class _Chain:
    def __init__(self, body):
        self.body = body


def _chains(op: str):
    params = {dt: relax.Var(f"p_{dt}", relax.TensorType((256,), dt)) for dt in L.EIGHT_BIT}
    chains = []
    for dt, zp in (("uint8", 128), ("int8", 0)):
        x = relax.op.dequantize(params[dt], _f(0.03), relax.const(zp, dt), -1, "float32")
        chains.append(_Chain(relax.op.quantize(_chain_body(op, x), _f(0.02), relax.const(-3, "int8"), -1, "int8")))
    return chains, params


CHAIN_OPS = sorted(L.ELEMENTWISE - {"relax.quantize", "relax.dequantize"})


@pytest.mark.parametrize("op", CHAIN_OPS)
def test_numpy_tables_equal_tvms_for_every_chain_operator(op):
    chains, params = _chains(op)
    inputs = {dt: L._table_inputs(dt) for dt in L.EIGHT_BIT}
    got = table_eval.evaluate(chains, params, inputs)
    want = L.compiled_tables(chains, params)
    for table, expected in zip(got, want):
        assert table is not None, f"{op}: not evaluated in numpy"
        assert table.dtype == expected.dtype
        np.testing.assert_array_equal(np.broadcast_to(table, expected.shape), expected, err_msg=op)
        assert len(np.unique(expected)) > 8, op  # the chain is a real function of the input


def test_every_chain_operator_is_covered():
    assert set(CHAIN_OPS) == {op for op in L.ELEMENTWISE if op not in ("relax.quantize", "relax.dequantize")}


def test_an_unknown_form_goes_to_tvm():
    """A float16 dequantize: the evaluator declines it, and :func:`evaluate_tables` computes that
    chain with TVM."""
    params = {dt: relax.Var(f"p_{dt}", relax.TensorType((256,), dt)) for dt in L.EIGHT_BIT}
    x16 = relax.op.dequantize(params["uint8"], relax.const(np.float16(0.03)), relax.const(128, "uint8"), -1, "float16")
    odd = _Chain(relax.op.quantize(relax.op.astype(relax.op.sigmoid(x16), "float32"), _f(1 / 255), relax.const(0, "uint8"),
                                   -1, "uint8"))
    chains = [odd]
    inputs = {dt: L._table_inputs(dt) for dt in L.EIGHT_BIT}
    assert table_eval.evaluate(chains, params, inputs) == [None]
    with pytest.raises(table_eval.Unsupported):
        table_eval.TableEvaluator({params[dt]: inputs[dt] for dt in params}).evaluate(odd.body)
    (table,) = L.evaluate_tables(chains, params)
    assert table.dtype == np.uint8 and table.shape == (256,) and len(np.unique(table)) > 8
    np.testing.assert_array_equal(table, L.compiled_tables(chains, params)[0])
