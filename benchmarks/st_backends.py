"""sentence-transformers' own CrossEncoder backends on one student folder, run inside .venv-optimum (transformers 4,
Optimum, optimum-intel) by benchmarks/bench_serving_backends.py, which times ours on the same folder and pairs.

    .venv-optimum/bin/python benchmarks/st_backends.py ARGS.json OUT.json

ARGS.json: folder, pairs (timing: queries, ads), test (queries, ads), calibration (queries, ads), batch_size,
max_length, repeats, latency_requests, contenders (their names; all when absent). Each contender is built as
sentence-transformers' docs build it, in a copy of the folder (the exports write files into it), then timed by
benchmarks/timing.py; OUT.json gets, per contender, pairs/s, p50/p99 latency and its probabilities on the test
pairs, and each library's version:

- ``st_torch``: ``CrossEncoder(folder)``; ``st_onnx``: ``backend="onnx"`` on the folder's ``model.onnx``;
- ``st_onnx_o2``: ``export_optimized_onnx_model(model, "O2", ...)``'s graph;
- ``st_onnx_int8``: ``export_dynamic_quantized_onnx_model`` with the config of this CPU (avx512_vnni, avx512 or avx2);
- ``st_openvino``: ``backend="openvino"`` (optimum-intel exports the torch weights; bf16 where the CPU has it);
- ``st_openvino_int8``: ``export_static_quantized_openvino_model``, its calibration set (GLUE sst2 from the Hub by
  default) swapped for the local calibration pairs, tokenized as pairs with its padding to max length.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from sentence_transformers import CrossEncoder
from sentence_transformers.backend import (
    export_dynamic_quantized_onnx_model,
    export_optimized_onnx_model,
    export_static_quantized_openvino_model,
)
from timing import latency_ms, throughput

LIBRARIES = ("sentence-transformers", "transformers", "torch", "onnxruntime", "optimum", "optimum-intel", "openvino")


def onnx_int8_config() -> str:
    """sentence-transformers' dynamic int8 config for this CPU's vector extensions."""
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    return "avx512" if "avx512f" in flags else "avx2"


def local_calibration(calibration: dict, max_length: int, tokenizer):
    """A stand-in for ``OVQuantizer.get_calibration_dataset``: the local pairs, tokenized as pairs, padded to
    ``max_length`` as sentence-transformers pads its calibration sentences."""

    def get_calibration_dataset(*_, **__):
        from datasets import Dataset

        queries, ads = calibration["queries"], calibration["ads"]
        encoded = tokenizer(queries, ads, padding="max_length", max_length=max_length, truncation=True)
        return Dataset.from_dict(dict(encoded))

    return get_calibration_dataset


def contenders(folder: str, args: dict):
    """(name, a function building the CrossEncoder) per contender, each in ``folder`` (a copy: exports write there)."""
    load = {"local_files_only": True, "max_length": args["max_length"], "device": "cpu"}
    onnx = {**load, "backend": "onnx"}
    yield "st_torch", lambda: CrossEncoder(folder, **load)
    yield "st_onnx", lambda: CrossEncoder(folder, **onnx)

    def exported(export, pattern: str, backend: str, **options):
        """A build that exports with ``export``, then loads the file it wrote (``pattern``: its name, as a glob)."""

        def build():
            source = CrossEncoder(folder, **load, backend=backend, **options)
            export(source)
            file_name = str(next(Path(folder).glob(pattern)).relative_to(folder))
            return CrossEncoder(folder, **load, backend=backend, model_kwargs={"file_name": file_name})

        return build

    config = onnx_int8_config()
    yield (
        "st_onnx_o2",
        exported(
            lambda m: export_optimized_onnx_model(m, "O2", folder),
            "onnx/model_O2.onnx",
            "onnx",
        ),
    )
    yield (
        "st_onnx_int8",
        exported(
            lambda m: export_dynamic_quantized_onnx_model(m, config, folder),
            f"onnx/model_*_{config}.onnx",  # qint8 or quint8, as the config's weight type
            "onnx",
        ),
    )
    yield "st_openvino", lambda: CrossEncoder(folder, **load, backend="openvino")

    def static_int8(model):
        from optimum.intel.openvino import OVQuantizationConfig, OVQuantizer

        OVQuantizer.get_calibration_dataset = local_calibration(
            args["calibration"], args["max_length"], model.tokenizer
        )
        samples = len(args["calibration"]["queries"])
        export_static_quantized_openvino_model(model, OVQuantizationConfig(num_samples=samples), folder)

    yield "st_openvino_int8", exported(static_int8, "openvino/openvino_model_qint8_quantized.xml", "openvino")


def main() -> None:
    warnings.simplefilter("ignore")  # the loaders' version chatter is not what the benchmark reads
    args = json.loads(Path(sys.argv[1]).read_text())
    pairs, test, size = args["pairs"], args["test"], args["batch_size"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = shutil.copytree(args["folder"], Path(tmp) / "student")
        for name, build in contenders(str(folder), args):
            if name not in args.get("contenders", [name]):
                continue
            model = build()

            def predict(queries, ads, batch, model=model):
                pairs_in = list(zip(queries, ads, strict=True))
                return model.predict(pairs_in, batch_size=batch, apply_softmax=True, show_progress_bar=False)

            rate, _ = throughput(predict, pairs["queries"], pairs["ads"], size, args["repeats"])
            results[name] = {
                "pairs_per_s": round(rate, 1),
                **latency_ms(predict, pairs["queries"], pairs["ads"], args["latency_requests"]),
                "test_probabilities": predict(test["queries"], test["ads"], size).tolist(),
            }
            print(f"{name:18s} {rate:9.1f} pairs/s", file=sys.stderr, flush=True)
    versions = {name: importlib.metadata.version(name) for name in LIBRARIES}
    Path(sys.argv[2]).write_text(
        json.dumps({"results": results, "versions": versions, "onnx_int8_config": onnx_int8_config()})
    )


if __name__ == "__main__":
    main()
