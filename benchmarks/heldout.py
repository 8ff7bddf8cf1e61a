"""Models outside the zoo, run exactly as the zoo runs its own (``zoo.runner``, a process each): a check that
what we tuned for is not all that works. torchvision, timm, transformers and Ultralytics architectures the zoo
lacks (grouped and mixed-kernel convolutions, dense concatenations, multi-query attention, re-parameterisable
blocks, GPT-2, RoBERTa, ALBERT, MobileBERT, wav2vec2, pose and segmentation heads), random weights, ORT
``quantize_static`` QDQ, their reduced input sizes, ``--threads`` (default one), quick timing.

    python benchmarks/heldout.py                       # all (about 30 minutes on 2 cores, 2 at a time)
    python benchmarks/heldout.py --models gpt2_4l,yolov8n_pose --jobs 1 --out DIR
    python benchmarks/heldout.py --jobs 1 --threads 1,2 --out DIR   # as the zoo measures (about 30 minutes)

Each model's result JSON and log go to ``--out``; ``summary.md`` has status, compile seconds, ORT INT8 /
tvm-lowprec at one thread and the slowest kernel. Timings with ``--jobs 2`` share the two cores: read the
ratios as rough, and time a model of interest alone (``--jobs 1``) or with ``zoo.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import zoo  # noqa: E402
from zoo import timm_models, torchvision, transformers_models, ultralytics_models  # noqa: E402
from zoo.common import ZooModel, require, seeded, torch_export  # noqa: E402

CACHE = Path(os.environ.get("TVM_LOWPREC_HELDOUT_CACHE", Path.home() / ".cache" / "tvm-lowprec-heldout"))


def _tv(name, small=128, stats=False):
    return torchvision._cnn(name, name, small=small, statistics=stats)


def _timm(name, small=128):
    return timm_models._entry(name, name, small=small)


def _text(name, config, **sizes):
    return ZooModel(name, "transformers", name, 64, 64, transformers_models._text(config, **sizes), "text", ("transformer",))


def _wav2vec2(path, size, dynamo):
    torch, transformers = require("torch"), require("transformers")
    cfg = transformers.Wav2Vec2Config(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                                      num_conv_pos_embeddings=64, num_conv_pos_embedding_groups=16)
    model = seeded(lambda: transformers.Wav2Vec2Model(cfg)).eval()
    torch_export(transformers_models._Hidden.wrap(model, ("input_values",)), (torch.randn(1, size),), path,
                 ["input_values"], ["last_hidden_state"], dynamo)


def _yolo(name, yaml):
    return ZooModel(name, "ultralytics", yaml, 320, 160, ultralytics_models._yolo(yaml), "image", ("detector",))


SMALL = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
HELDOUT: dict[str, ZooModel] = {m.name: m for m in (
    _tv("mobilenet_v2"), _tv("resnext50_32x4d", small=96), _tv("mnasnet1_0"), _tv("densenet121", small=96),
    _tv("googlenet"), _tv("regnet_x_400mf"), _tv("efficientnet_v2_s", small=96, stats=True), _tv("swin_t"),
    _tv("mobilenet_v3_small"), _tv("resnet18", small=112),
    _timm("mobileone_s0"), _timm("fastvit_t8"), _timm("edgenext_xx_small"), _timm("mixnet_s"), _timm("lcnet_050"),
    _timm("rexnet_100"), _timm("mobilenetv4_conv_small"), _timm("mobilenetv4_hybrid_medium"), _timm("hgnetv2_b0"),
    _timm("pvt_v2_b0"), _timm("dla34", small=96), _timm("tinynet_e"), _timm("efficientformerv2_s0"),
    _timm("poolformer_s12", small=96),
    _text("gpt2_4l", "GPT2Config", n_layer=4, n_embd=256, n_head=4), _text("roberta_4l", "RobertaConfig", **SMALL),
    _text("albert_4l", "AlbertConfig", embedding_size=128, **SMALL), _text("mobilebert", "MobileBertConfig", num_hidden_layers=4),
    ZooModel("wav2vec2_4l", "transformers", "wav2vec2 (4 layers, d 256)", 16000, 8000, _wav2vec2, "audio", ("transformer",)),
    _yolo("yolov8n_pose", "yolov8n-pose.yaml"), _yolo("yolov8n_seg", "yolov8n-seg.yaml"), _yolo("yolov5nu", "yolov5nu.yaml"),
)}


def register() -> None:
    """Add the held-out models to the zoo's registry (the runner and ort_profile.py look them up there)."""
    zoo.REGISTRY.update(HELDOUT)


def _run(name: str, out: Path, timeout: float, threads: list[int]) -> dict:
    config = json.dumps(dict(cache=str(CACHE), small=True, threads=threads, timing="quick", profile=True, top=3))
    result = out / f"{name}.json"
    with open(out / f"{name}.log", "w") as log:
        subprocess.run(["timeout", str(int(timeout)), sys.executable, str(Path(__file__).resolve()), "--child", "--name", name,
                        "--config", config, "--result", str(result)], cwd=str(HERE), stdout=log, stderr=subprocess.STDOUT)
    try:
        return json.loads(result.read_text())
    except (OSError, ValueError):
        return {"model": name, "status": "crashed", "stage": "?", "error": f"no result (see {name}.log)"}


def _ratio(r: dict, threads: int) -> str:
    t = (r.get("times") or {}).get(str(threads), {})
    ours, ort = (t.get(k, {}).get("ms") for k in ("tvm-lowprec", "ort-int8"))
    return f"{ort / ours:.2f}" if ours and ort else ""


def _row(r: dict, threads: list[int]) -> list:
    top = (r.get("profile_top") or [{}])[0] if isinstance(r.get("profile_top"), list) else {}
    return [r["model"], r.get("status"), r.get("compile_s", ""), *(_ratio(r, t) for t in threads),
            f"{r['cosine']:.5f}" if r.get("cosine") is not None else "",
            f"{r['ort_spread']:.5f}" if r.get("ort_spread") is not None else "", r.get("ok_by") or "", top.get("name", "")[:48],
            (r.get("error") or "")[:100]]


def main(argv=None) -> None:
    if argv is None and "--child" in sys.argv:
        register()
        from zoo import runner

        sys.argv.remove("--child")
        runner.main()
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated (default: all)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--threads", default="1", help="comma-separated thread counts (default 1; the zoo's: 1,2)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tvm-lowprec-heldout"))
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(HELDOUT)
    threads = [int(t) for t in args.threads.split(",")]
    args.out = args.out.resolve()  # the children run in benchmarks/
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda n: _run(n, args.out, args.timeout, threads), names))
    from tvm_lowprec.bench.report import markdown_table

    head = ["model", "status", "compile s", *(f"ORT INT8 / tvm-lowprec ({t} thread{'s' if t > 1 else ''})" for t in threads),
            "cosine vs ORT QDQ",
            "ORT INT8's own cosine", "ok by", "slowest kernel", "error"]
    text = "\n".join([f"# Held-out models ({len(names)}, {time.time() - start:.0f} s, --jobs {args.jobs})", "",
                      *markdown_table(head, [_row(r, threads) for r in results], text_columns=2)])
    (args.out / "summary.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
