"""A small DBNet-style text detector (the mobile OCR kind: MobileNetV3-style backbone, FPN neck, DB
head), built with ``onnx.helper`` the way ``torch.onnx.export`` writes it with dynamic height and width
(opset 17, random weights from a fixed seed, never downloaded).

Structure:

* backbone: stem ``Conv3x3 s2 + BatchNormalization + HardSwish``, then inverted-residual blocks
  (1x1 expand Conv+BN+act, depthwise 3x3 Conv+BN+act, some with stride 2, squeeze-excite
  ``GlobalAveragePool -> 1x1 Conv -> Relu -> 1x1 Conv -> HardSigmoid -> Mul``, 1x1 project Conv+BN,
  residual ``Add`` where the shapes allow) down to stride 32. Activations are Relu, the ONNX
  ``HardSwish`` op, or hard-swish written as ``x * HardSigmoid(x)`` (exporters emit both forms).
* neck (FPN): 1x1 lateral convolutions on the stride 4, 8, 16 and 32 stages; top-down nearest
  ``Resize`` by constant scales and, as torch exports ``F.interpolate(x, size=y.shape[2:])``, by
  ``sizes`` computed from the target's shape (``Shape -> Slice -> Concat`` and
  ``Shape -> Gather -> Unsqueeze -> Concat``); ``Add``; 3x3 convolutions; every level upsampled to
  stride 4 and concatenated.
* DB head: ``Conv3x3 + BN + Relu -> ConvTranspose(2, s2) + BN + Relu -> ConvTranspose(2, s2) -> Sigmoid``:
  the probability map ``maps [1, 1, H, W]`` at the input's resolution (H and W multiples of 32).

Every BatchNormalization is its own node with random statistics (the importer folds those after a
Conv; nothing is pre-folded here), and convolutions followed by BN have no bias, as torch writes them.

``db_like(activation="decomposed")`` is the same network (same weights) as paddle2onnx exports
PaddleOCR's mobile detectors (TensorFlow and older torch exports write it alike): every hard-swish is
``x * Clip(x + 3, 0, 6) / 6`` (``Add``, ``Clip`` with constant ``min``/``max`` inputs, ``Mul``, ``Div``);
the squeeze-excite gates stay ``HardSigmoid -> Mul`` and the head ``ConvTranspose -> BatchNormalization``,
NCHW. Its op counts (``benchmarks/models/build.py``'s ``textdet-decomposed``, ORT 1.32; a PP-OCR mobile
detector has 89 Add, 86 Mul, 24 Div in the same pattern):

* as built: 43 Conv, 24 BatchNormalization, 17 Add, 17 Mul, 12 Relu, 11 Clip, 11 Div, 6 HardSigmoid,
  6 GlobalAveragePool, 6 Resize, 2 ConvTranspose, 1 Sigmoid and the resize-size subgraphs (4 Shape,
  3 Slice, 2 Gather, 2 Unsqueeze, 3 Concat);
* after ``quant_pre_process`` (input pinned): the shape subgraphs folded (1 Concat left) and every
  BatchNormalization folded, the one after the ConvTranspose too (ORT's ConvBNFusion takes it);
* after ``quantize_static`` (QDQ, per-channel): 111 QuantizeLinear, 194 DequantizeLinear (83 of them
  on initializers); a QuantizeLinear -> DequantizeLinear pair after each of the 17 Add, 17 Mul,
  11 Div (not an operator ORT quantizes: its neighbours' pairs surround it) and 6 HardSigmoid. The
  11 Clip and 12 Relu are gone: ORT's quantizer drops an activation whose input has no other reader
  and gives that input the activation's range, so each hard-swish ``Add`` is quantized to [0, 6]
  with zero point 0 and uint8 saturation does the clipping. Quantized without ``quant_pre_process``,
  the 24 BatchNormalization stay, each between a DequantizeLinear and a QuantizeLinear (135 Q, 253 DQ).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from .detector import _Graph


class _Builder(_Graph):
    def conv(self, name, x, cin, cout, k=1, stride=1, group=1, bias=False):
        fan_in = cin // group * k * k
        w = self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)
        inputs = [x, self.const(name + ".weight", w, np.float32)]
        if bias:
            inputs.append(self.const(name + ".bias", self.rng.standard_normal(cout) * 0.1, np.float32))
        return self.op(name, "Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
                       group=group, dilations=[1, 1])

    def conv_transpose(self, name, x, cin, cout, bias=True, gain=1.0):
        w = self.rng.standard_normal((cin, cout, 2, 2)) * np.sqrt(2.0 / cin) * gain
        inputs = [x, self.const(name + ".weight", w, np.float32)]
        if bias:
            inputs.append(self.const(name + ".bias", self.rng.standard_normal(cout) * 0.1, np.float32))
        return self.op(name, "ConvTranspose", inputs, kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0],
                       dilations=[1, 1], group=1)

    def bn(self, name, x, c):
        """BatchNormalization (inference) with non-trivial statistics: folding errors would show."""
        r = self.rng
        params = [("weight", r.uniform(0.6, 1.6, c)), ("bias", r.standard_normal(c) * 0.2),
                  ("running_mean", r.standard_normal(c) * 0.3), ("running_var", r.uniform(0.4, 2.5, c))]
        inputs = [x] + [self.const(f"{name}.{p}", v, np.float32) for p, v in params]
        return self.op(name, "BatchNormalization", inputs, epsilon=1e-5, momentum=0.9)

    def act(self, name, x, kind):
        if kind == "relu":
            return self.op(name + ".relu", "Relu", [x])
        if kind == "hardswish":  # the ONNX op (opset 14+)
            return self.op(name + ".hardswish", "HardSwish", [x])
        if kind == "hsig_mul":  # x * HardSigmoid(x), as older exporters write hard-swish
            hs = self.op(name + ".hardsigmoid", "HardSigmoid", [x], alpha=1.0 / 6, beta=0.5)
            return self.op(name + ".mul", "Mul", [x, hs])
        if kind == "decomposed":  # x * clip(x + 3, 0, 6) / 6, as paddle2onnx and TensorFlow write hard-swish
            shifted = self.op(name + ".add", "Add", [x, self.const(name + ".offset", [3.0], np.float32)])
            clipped = self.op(name + ".clip", "Clip", [shifted, self.const(name + ".min", 0.0, np.float32),
                                                        self.const(name + ".max", 6.0, np.float32)])
            scaled = self.op(name + ".mul", "Mul", [x, clipped])
            return self.op(name + ".div", "Div", [scaled, self.const(name + ".scale", [6.0], np.float32)])
        assert kind is None, kind
        return x

    def conv_bn(self, name, x, cin, cout, k=1, stride=1, group=1, act="relu"):
        y = self.bn(name + ".bn", self.conv(name + ".conv", x, cin, cout, k, stride, group), cout)
        return self.act(name, y, act)

    def squeeze_excite(self, name, x, c, reduction=4):
        s = self.op(name + ".pool", "GlobalAveragePool", [x])
        s = self.op(name + ".relu", "Relu", [self.conv(name + ".conv1", s, c, c // reduction, bias=True)])
        s = self.conv(name + ".conv2", s, c // reduction, c, bias=True)
        s = self.op(name + ".hardsigmoid", "HardSigmoid", [s], alpha=0.2, beta=0.5)  # as PaddleOCR's SE
        return self.op(name + ".scale", "Mul", [x, s])

    def inverted_residual(self, name, x, cin, expand, cout, stride, act, se):
        y = self.conv_bn(name + ".expand", x, cin, expand, act=act)
        y = self.conv_bn(name + ".dw", y, expand, expand, k=3, stride=stride, group=expand, act=act)
        if se:
            y = self.squeeze_excite(name + ".se", y, expand)
        y = self.conv_bn(name + ".project", y, expand, cout, act=None)
        if stride == 1 and cin == cout:
            y = self.op(name + ".add", "Add", [x, y])
        return y

    def resize_scales(self, name, x, factor):
        """Nearest upsampling by constant scales (``F.interpolate(scale_factor=...)``)."""
        scales = self.const(name + ".scales", [1.0, 1.0, float(factor), float(factor)], np.float32)
        return self.op(name, "Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                       nearest_mode="floor")

    def resize_like(self, name, x, like, gather=False):
        """Nearest resize of ``x`` to the spatial size of ``like`` (``F.interpolate(x, size=like.shape[2:])``):
        ``sizes = Concat(Shape(x)[0:2], Shape(like)[2:4])``, the last part from Slice or from two Gathers."""
        nc = self.op(name + ".nc", "Slice", [self.op(name + ".xshape", "Shape", [x]), self.const(name + ".s0", [0]),
                                            self.const(name + ".s2", [2])])
        shape = self.op(name + ".shape", "Shape", [like])
        if gather:
            ax0 = self.const(name + ".ax0", [0])
            dims = []
            for d, i in (("h", 2), ("w", 3)):
                dim = self.op(f"{name}.{d}", "Gather", [shape, self.const(f"{name}.i{i}", i)], axis=0)
                dims.append(self.op(f"{name}.{d}1", "Unsqueeze", [dim, ax0]))
        else:
            start, end = self.const(name + ".s2b", [2]), self.const(name + ".s4", [4])
            dims = [self.op(name + ".hw", "Slice", [shape, start, end])]
        sizes = self.op(name + ".sizes", "Concat", [nc, *dims], axis=0)
        return self.op(name, "Resize", [x, "", "", sizes], mode="nearest", coordinate_transformation_mode="asymmetric",
                       nearest_mode="floor")


# (name, expand, out, stride, activation, squeeze-excite); the stage outputs the FPN reads are marked
_BLOCKS = [
    ("block1", 16, 8, 1, "relu", True),
    ("block2", 24, 16, 2, "relu", False),  # stride 4  -> C2
    ("block3", 32, 16, 1, "hsig_mul", True),
    ("block4", 48, 24, 2, "hardswish", True),  # stride 8  -> C3
    ("block5", 48, 32, 2, "hsig_mul", True),  # stride 16 -> C4
    ("block6", 48, 32, 1, "hardswish", True),
    ("block7", 48, 48, 2, "hsig_mul", True),  # stride 32 -> C5
]
_TAPS = {"block3": 4, "block4": 8, "block6": 16, "block7": 32}


# how each activation form of _BLOCKS is written: as the exporter of the ``activation`` argument writes it
_ACTIVATIONS = {
    "onnx": {},  # as torch.onnx.export (opset 14+) writes hard-swish: the HardSwish op, or x * HardSigmoid(x)
    "decomposed": {"hardswish": "decomposed", "hsig_mul": "decomposed"},  # paddle2onnx, TensorFlow
}


def db_like(seed: int = 0, inner: int = 24, activation: str = "onnx") -> onnx.ModelProto:
    """DBNet-like text detector with dynamic height/width; ``maps [1, 1, H, W]`` is the text probability.

    ``activation="decomposed"``: every hard-swish written as ``x * clip(x + 3, 0, 6) / 6`` (``Add``,
    ``Clip`` with constant ``min``/``max`` inputs, ``Mul``, ``Div``), as paddle2onnx exports PaddleOCR's
    detectors; the squeeze-excite gates stay ``HardSigmoid -> Mul`` (PaddleOCR's), the weights are the
    same (the activations hold none).
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, not {activation!r}")
    acts = _ACTIVATIONS[activation]
    g = _Builder(seed)
    # 1. backbone
    x = g.conv_bn("stem", "images", 3, 8, k=3, stride=2, act=acts.get("hardswish", "hardswish"))
    c, taps = 8, {}
    for name, expand, cout, stride, act, se in _BLOCKS:
        x = g.inverted_residual(name, x, c, expand, cout, stride, acts.get(act, act), se)
        c = cout
        if name in _TAPS:
            taps[_TAPS[name]] = (x, c)
    # 2. FPN: laterals, top-down, 3x3 smoothing convs, all levels to stride 4
    lat = {s: g.conv(f"neck.in{s}", t, ch, inner) for s, (t, ch) in taps.items()}
    p32 = lat[32]
    p16 = g.op("neck.add16", "Add", [lat[16], g.resize_scales("neck.up32", p32, 2)])
    p8 = g.op("neck.add8", "Add", [lat[8], g.resize_like("neck.up16", p16, lat[8])])
    p4 = g.op("neck.add4", "Add", [lat[4], g.resize_like("neck.up8", p8, lat[4], gather=True)])
    outs = []
    for s, p in ((32, p32), (16, p16), (8, p8), (4, p4)):
        o = g.conv(f"neck.out{s}", p, inner, inner // 4, k=3)
        outs.append(o if s == 4 else g.resize_scales(f"neck.out{s}.up", o, s // 4))
    fuse = g.op("neck.concat", "Concat", outs, axis=1)  # [1, inner, H/4, W/4]
    # 3. DB head (probability branch)
    h = g.conv_bn("head.conv1", fuse, inner, inner // 4, k=3)
    h = g.bn("head.conv2.bn", g.conv_transpose("head.conv2", h, inner // 4, inner // 4), inner // 4)
    h = g.op("head.conv2.relu", "Relu", [h])
    h = g.conv_transpose("head.conv3", h, inner // 4, 1, gain=0.25)  # logits of std ~2: a map not saturated
    g.op("maps", "Sigmoid", [h])

    graph = helper.make_graph(
        g.nodes, "db_like",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, "height", "width"])],
        [helper.make_tensor_value_info("maps", TensorProto.FLOAT, [1, 1, "height", "width"])],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


if __name__ == "__main__":
    import onnxruntime as ort

    model = db_like()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"{len(model.graph.node)} nodes, {len(model.graph.initializer)} initializers; ops: {', '.join(ops)}")
    for h, w in [(64, 64), (96, 128)]:
        img = np.random.default_rng(1).standard_normal((1, 3, h, w)).astype(np.float32)
        (maps,) = sess.run(["maps"], {"images": img})
        assert maps.shape == (1, 1, h, w), maps.shape
        assert np.isfinite(maps).all()
        print(f"1x3x{h}x{w}: maps {maps.shape} range [{maps.min():.3f}, {maps.max():.3f}], "
              f"mean {maps.mean():.3f}, std {maps.std():.3f} ok")
