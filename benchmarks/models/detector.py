"""A small YOLOv8-style detector, built with ``onnx.helper`` the way ``torch.onnx.export`` writes it
with dynamic axes (opset 17, random weights from a fixed seed, never downloaded).

Exported detectors carry many *shape subgraphs*: ``Shape -> Gather/Slice -> Mul -> Concat`` feeding
``Resize(sizes=...)`` and ``Reshape``, ``Range``/``Expand``/``ConstantOfShape`` building anchor grids and
stride tensors, the DFL head reshaped from computed shapes.  With ``batch``/``height``/``width`` left
dynamic none of these are constants; once the input shape is fixed every one of them is, so this model
exercises folding of shapes at import.  Structure: stem convs, a C2f block (Split, bottleneck with
residual Add, Concat), a stride-2 conv, SPPF (three chained MaxPools), nearest upsampling to stride 4,
two heads (stride 4 and 8), DFL (Softmax + fixed 1x1 Conv) and box decoding against the anchors.
Every Conv is followed by SiLU written as ``x * Sigmoid(x)``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Graph:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def op(self, name, op_type, inputs, n_out=1, **attrs):
        outs = [name] if n_out == 1 else [f"{name}.{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, name, value, dtype=np.int64):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def conv(self, name, x, cin, cout, k=1, stride=1, act=True):
        fan_in = cin * k * k
        w = self.rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / fan_in)
        b = self.rng.standard_normal(cout) * 0.1
        y = self.op(name, "Conv", [x, self.const(name + ".w", w, np.float32), self.const(name + ".b", b, np.float32)],
                    kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
        if not act:
            return y
        return self.op(name + ".silu", "Mul", [y, self.op(name + ".sigmoid", "Sigmoid", [y])])

    def batch_dim(self, name, x):
        """``Unsqueeze(Gather(Shape(x), 0), [0])``: the batch size as a 1-D int64 tensor."""
        b = self.op(name + ".gather", "Gather", [self.op(name + ".shape", "Shape", [x]), self.const(name + ".i0", 0)])
        return self.op(name + ".unsqueeze", "Unsqueeze", [b, self.const(name + ".ax0", [0])])

    def reshape(self, name, x, tail):
        """``Reshape(x, Concat([batch, *tail]))`` with batch read from ``Shape(x)``."""
        shape = self.op(name + ".concat", "Concat", [self.batch_dim(name + ".batch", x), self.const(name + ".tail", tail)],
                        axis=0)
        return self.op(name, "Reshape", [x, shape])


def _anchors(g: _Graph, name: str, feat: str, stride: float):
    """Anchor centres ``[2, H*W]`` and strides ``[1, H*W]`` computed from ``Shape(feat)``."""
    shape = g.op(name + ".shape", "Shape", [feat])
    h = g.op(name + ".h", "Gather", [shape, g.const(name + ".i2", 2)])
    w = g.op(name + ".w", "Gather", [shape, g.const(name + ".i3", 3)])
    zero, one, half = g.const(name + ".zero", 0), g.const(name + ".one", 1), g.const(name + ".half", 0.5, np.float32)
    axes = {0: g.const(name + ".ax0", [0]), 1: g.const(name + ".ax1", [1])}
    sx = g.op(name + ".sx", "Add", [g.op(name + ".castx", "Cast", [g.op(name + ".rangex", "Range", [zero, w, one])],
                                         to=TensorProto.FLOAT), half])
    sy = g.op(name + ".sy", "Add", [g.op(name + ".casty", "Cast", [g.op(name + ".rangey", "Range", [zero, h, one])],
                                         to=TensorProto.FLOAT), half])
    h1 = g.op(name + ".h1", "Unsqueeze", [h, axes[0]])
    w1 = g.op(name + ".w1", "Unsqueeze", [w, axes[0]])
    hw = g.op(name + ".hw", "Concat", [h1, w1], axis=0)
    gx = g.op(name + ".gx", "Expand", [g.op(name + ".sx2d", "Unsqueeze", [sx, axes[0]]), hw])  # [H, W]
    gy = g.op(name + ".gy", "Expand", [g.op(name + ".sy2d", "Unsqueeze", [sy, axes[1]]), hw])  # [H, W]
    flat = g.const(name + ".flat", [1, -1])
    xy = g.op(name + ".xy", "Concat", [g.op(name + ".gxf", "Reshape", [gx, flat]),
                                      g.op(name + ".gyf", "Reshape", [gy, flat])], axis=0)  # [2, H*W]
    n = g.op(name + ".n", "Concat", [g.const(name + ".one1", [1]), g.op(name + ".hxw", "Mul", [h1, w1])], axis=0)
    st = g.op(name + ".stride", "ConstantOfShape", [n],
              value=numpy_helper.from_array(np.array([stride], np.float32)))  # [1, H*W]
    return xy, st


def yolo_like(seed: int = 0, classes: int = 3, reg_max: int = 4) -> onnx.ModelProto:
    """YOLOv8-like detector with dynamic batch/height/width; outputs ``boxes [batch, 4, A]`` (cx, cy, w, h
    in pixels) and ``scores [batch, classes, A]`` with ``A = (H/4)(W/4) + (H/8)(W/8)``."""
    g = _Graph(seed)
    # 1. stem
    x = g.conv("stem.conv", "images", 3, 8, k=3, stride=2)
    x = g.conv("down1.conv", x, 8, 16, k=3, stride=2)
    # 2. C2f
    x = g.conv("c2f.cv1", x, 16, 16)
    a, b = g.op("c2f.split", "Split", [x, g.const("c2f.split.sizes", [8, 8])], n_out=2, axis=1)
    m = g.conv("c2f.m.cv2", g.conv("c2f.m.cv1", b, 8, 8, k=3), 8, 8, k=3)
    m = g.op("c2f.m.add", "Add", [b, m])
    p3 = g.conv("c2f.cv2", g.op("c2f.concat", "Concat", [a, b, m], axis=1), 24, 16)
    # 3. down to stride 8
    p4 = g.conv("down2.conv", p3, 16, 32, k=3, stride=2)
    # 4. SPPF
    y0 = g.conv("sppf.cv1", p4, 32, 16)
    ys = [y0]
    for i in range(1, 4):
        ys.append(g.op(f"sppf.pool{i}", "MaxPool", [ys[-1]], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]))
    p4 = g.conv("sppf.cv2", g.op("sppf.concat", "Concat", ys, axis=1), 64, 32)
    # 5. nearest upsampling with sizes computed from Shape(p4), concat with P3
    s = g.op("up.shape", "Shape", [p4])
    nc = g.op("up.nc", "Slice", [s, g.const("up.s0", [0]), g.const("up.s2", [2])])
    hw = g.op("up.hw", "Slice", [s, g.const("up.s2b", [2]), g.const("up.s4", [4])])
    hw2 = g.op("up.hw2", "Mul", [hw, g.const("up.two", [2, 2])])
    sizes = g.op("up.sizes", "Concat", [nc, hw2], axis=0)
    up = g.op("up.resize", "Resize", [p4, "", "", sizes], mode="nearest",
              coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    p3 = g.conv("up.conv", g.op("up.concat", "Concat", [up, p3], axis=1), 48, 16)
    # 6. heads, flattened with Reshape([batch, C, -1]) computed from Shape
    boxes, logits, anchors, strides = [], [], [], []
    for i, (feat, cin, stride) in enumerate([(p3, 16, 4.0), (p4, 32, 8.0)]):
        bx = g.conv(f"head{i}.box", feat, cin, 4 * reg_max, act=False)
        cl = g.conv(f"head{i}.cls", feat, cin, classes, act=False)
        boxes.append(g.reshape(f"head{i}.box.flat", bx, [4 * reg_max, -1]))
        logits.append(g.reshape(f"head{i}.cls.flat", cl, [classes, -1]))
        xy, st = _anchors(g, f"anchors{i}", feat, stride)
        anchors.append(xy)
        strides.append(st)
    box = g.op("head.box.concat", "Concat", boxes, axis=2)  # [batch, 4*reg_max, A]
    cls = g.op("head.cls.concat", "Concat", logits, axis=2)  # [batch, classes, A]
    anc = g.op("anchors.concat", "Concat", anchors, axis=1)  # [2, A]
    strd = g.op("strides.concat", "Concat", strides, axis=1)  # [1, A]
    # 7. DFL
    d = g.reshape("dfl.reshape", box, [4, reg_max, -1])
    d = g.op("dfl.transpose", "Transpose", [d], perm=[0, 2, 1, 3])  # [batch, reg_max, 4, A]
    d = g.op("dfl.softmax", "Softmax", [d], axis=1)
    w = g.const("dfl.conv.w", np.arange(reg_max).reshape(1, reg_max, 1, 1), np.float32)
    d = g.op("dfl.conv", "Conv", [d, w], kernel_shape=[1, 1])  # [batch, 1, 4, A]
    d = g.reshape("dfl.out", d, [4, -1])  # [batch, 4, A]
    # 8. decode
    lt, rb = g.op("decode.split", "Split", [d, g.const("decode.split.sizes", [2, 2])], n_out=2, axis=1)
    x1y1 = g.op("decode.x1y1", "Sub", [anc, lt])
    x2y2 = g.op("decode.x2y2", "Add", [anc, rb])
    c = g.op("decode.c", "Div", [g.op("decode.sum", "Add", [x1y1, x2y2]), g.const("decode.two", 2.0, np.float32)])
    wh = g.op("decode.wh", "Sub", [x2y2, x1y1])
    g.op("boxes", "Mul", [g.op("decode.concat", "Concat", [c, wh], axis=1), strd])
    g.op("scores", "Sigmoid", [cls])

    graph = helper.make_graph(
        g.nodes, "yolo_like",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["batch", 4, "anchors"]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", classes, "anchors"])],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


if __name__ == "__main__":
    import onnxruntime as ort

    model = yolo_like()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    print(f"{len(model.graph.node)} nodes, {len(model.graph.initializer)} initializers")
    for n, h, w in [(1, 64, 64), (2, 96, 128)]:
        img = np.random.default_rng(1).standard_normal((n, 3, h, w)).astype(np.float32)
        boxes, scores = sess.run(["boxes", "scores"], {"images": img})
        a = (h // 4) * (w // 4) + (h // 8) * (w // 8)
        assert boxes.shape == (n, 4, a) and scores.shape == (n, 3, a), (boxes.shape, scores.shape)
        assert np.isfinite(boxes).all() and np.isfinite(scores).all()
        print(f"{n}x3x{h}x{w}: boxes {boxes.shape} range [{boxes.min():.2f}, {boxes.max():.2f}], "
              f"scores {scores.shape} range [{scores.min():.3f}, {scores.max():.3f}], A={a} ok")
