from setuptools import find_packages, setup

setup(
    name="tvm-lowprec",
    version="0.1.0",
    description="Quantized ONNX models on low-precision CPU instructions (VNNI, AVX2) through Apache TVM",
    packages=find_packages(include=["tvm_lowprec", "tvm_lowprec.*"]) + ["tvm_lowprec.schedules"],
    # schedules/ (tuning records shipped per target row) is installed as tvm_lowprec/schedules/
    package_dir={"tvm_lowprec.schedules": "schedules"},
    package_data={"tvm_lowprec": ["data/*.onnx", "data/*.c"], "tvm_lowprec.schedules": ["README.md", "*/*.json"]},
    python_requires=">=3.10",
    install_requires=[
        # pinned together: with apache-tvm-ffi 0.1.15.x every Schedule.tensorize segfaults
        "apache-tvm==0.27.0.post1",
        "apache-tvm-ffi==0.1.14.post1",
        "numpy",
        "onnx>=1.16",
        # imported at run time by MetaSchedule and TVM's RPC (not declared by apache-tvm itself):
        "cloudpickle",  # popen_pool: the builder and runner workers of every tuning run
        "psutil",  # MetaSchedule's local builder and runner pools
        "tornado",  # TVM's RPC tracker and server (tune(..., rpc_tracker=...))
        "tqdm",
        "xgboost",  # MetaSchedule's cost model
    ],
    extras_require={
        # the tests run the benchmarks' code paths too: everything the benchmarks import but torch
        # (sympy: ONNX Runtime's quant_pre_process, which builds the benchmark models, imports it)
        # cuobjdump + nvdisasm (NVIDIA's wheels, no GPU needed): the tests read the SASS of every cubin
        # onnx-ir: ONNX Runtime's MatMulNBitsQuantizer imports it (the INT4 tests quantize with it)
        # pytest-xdist: the README's test command runs the suite on two processes (CI's 2 cores)
        "test": ["pytest", "pytest-xdist", "onnxruntime>=1.18", "matplotlib", "threadpoolctl", "sympy", "ml_dtypes", "onnx-ir",
                 "nvidia-cuda-cuobjdump; platform_system == 'Linux' and platform_machine == 'x86_64'",
                 "nvidia-cuda-nvdisasm; platform_system == 'Linux' and platform_machine == 'x86_64'"],
        "bench": ["onnxruntime>=1.18", "matplotlib", "threadpoolctl", "sympy"],
        # benchmarks/zoo.py: models built the way users build them (random weights, offline); torch's
        # default (dynamo) ONNX exporter needs onnxscript. A torchvision whose C++ ops do not load with
        # this torch still works: benchmarks/zoo/torchvision.py declares their schemas before the import
        "zoo": ["onnxruntime>=1.18", "matplotlib", "sympy", "torch", "torchvision", "timm", "transformers",
                "ultralytics", "onnxscript"],
        # benchmarks/zoo/keras_models.py: keras.applications models converted by tf2onnx (keras comes with
        # TensorFlow). Co-installs with numpy 2.4, onnx 1.23, protobuf 7 (tensorflow-cpu 2.21, tf2onnx 1.17);
        # where it does not, a separate environment named by TVM_LOWPREC_TF_PYTHON runs the conversion
        # (tensorflow-cpu: the CPU-only wheel, Linux x86-64; elsewhere the tensorflow wheel is the CPU one)
        # PyTorch's PT2E quantization (prepare_pt2e / convert_pt2e: torchao since torch 2.10), for
        # tvm_lowprec.from_pt2e and tests/test_pt2e.py
        "pt2e": ["torch", "torchao"],
        # decoder language models: random-weight transformers configs exported by ONNX Runtime GenAI's
        # model builder (benchmarks/models/llm.py, tests/test_genai_decoder.py)
        "llm": ["torch", "transformers", "onnxruntime-genai"],
        "zoo-tf": ["tensorflow-cpu; platform_system == 'Linux' and platform_machine == 'x86_64'",
                   "tensorflow; platform_system != 'Linux' or platform_machine != 'x86_64'", "tf2onnx"],
    },
    entry_points={"console_scripts": ["tvm-lowprec=tvm_lowprec.cli:main"]},
)
