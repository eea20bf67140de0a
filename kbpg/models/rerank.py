"""Reranker clients: the shared rerank API, Hugging Face TEI, and an LLM ranking a list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kbpg.errors import ModelError
from kbpg.models.chat import ChatClient
from kbpg.models.parsing import as_positions, fill_order, parse_json_array
from kbpg.models.transport import ModelHTTP

# What a reranker reads of one chunk: title, section and content, cut to this many
# characters. 2,000 characters are ~400-500 tokens of English, inside the 512-token window
# of the common cross-encoders (bge-reranker, ms-marco MiniLM) with room for the query;
# kbpg's chunks (<= 256 MiniLM tokens) are never cut by it.
DEFAULT_MAX_CHARS = 2000


@dataclass(frozen=True)
class RerankHit:
    """A candidate's place in the reranker's order: its position in the input, its score."""

    index: int
    score: float


def document_text(title: str, section: str, content: str, max_chars: int) -> str:
    """What a reranker reads of a chunk: its heading (title and section, the title once,
    as in the context block), then its content, cut to `max_chars` characters."""
    if title and section.startswith(title):
        heading = section
    elif section:
        heading = f"{title} — {section}" if title else section
    else:
        heading = title
    return f"{heading}\n{content.strip()}".strip()[:max_chars]


class Reranker(Protocol):
    """Orders candidate texts by relevance to a query (best first)."""

    @property
    def provider(self) -> str: ...

    @property
    def model(self) -> str: ...

    def rerank(self, query: str, documents: Sequence[str]) -> list[RerankHit]:
        """Hits best first; may cover fewer documents than given (the caller fills in)."""
        ...


def _hits_from(
    items: Any, count: int, index_key: str, score_key: str, where: str
) -> list[RerankHit]:
    if not isinstance(items, list):
        raise ModelError(f"{where} sent an unexpected response: no list of results")
    hits: dict[int, RerankHit] = {}
    for item in items:
        try:
            index, score = item[index_key], float(item[score_key])
        except (KeyError, TypeError, ValueError):
            raise ModelError(
                f"{where} sent an unexpected response: result {str(item)[:100]!r} lacks "
                f"{index_key!r} or a numeric {score_key!r}"
            ) from None
        if isinstance(index, int) and 0 <= index < count and index not in hits:
            hits[index] = RerankHit(index, score)
    if not hits:
        raise ModelError(f"{where} returned no usable result for {count} documents")
    return sorted(hits.values(), key=lambda h: (-h.score, h.index))


class ApiReranker:
    """The request most rerank servers share: Cohere v1/v2, Jina, vLLM, Infinity, LiteLLM.

    POST `{model, query, documents: [str], top_n}` to the endpoint URL itself, read
    `results[].index` and `results[].relevance_score`. `top_n` asks for every candidate:
    the per-document cap after reranking needs each one's place.
    """

    provider = "api"

    def __init__(self, http: ModelHTTP, model: str) -> None:
        self.http = http
        self._model = model

    @property
    def model(self) -> str:
        return self._model

    def rerank(self, query: str, documents: Sequence[str]) -> list[RerankHit]:
        body = {
            "model": self._model,
            "query": query,
            "documents": list(documents),
            "top_n": len(documents),
        }
        answer = self.http.post_json("", body)
        results = answer.get("results") if isinstance(answer, dict) else None
        return _hits_from(results, len(documents), "index", "relevance_score", self.http.base_url)


class TeiReranker:
    """Hugging Face text-embeddings-inference: POST `{query, texts, truncate}` to `/rerank`,
    answer a bare list of `{index, score}`."""

    provider = "tei"

    def __init__(self, http: ModelHTTP, model: str = "") -> None:
        self.http = http
        self._model = model or "tei"

    @property
    def model(self) -> str:
        return self._model

    def rerank(self, query: str, documents: Sequence[str]) -> list[RerankHit]:
        body = {"query": query, "texts": list(documents), "truncate": True}
        answer = self.http.post_json("", body)
        return _hits_from(answer, len(documents), "index", "score", self.http.base_url)


LLM_RERANK_SYSTEM = (
    "You rank passages by how well they answer a search query. Answer with a JSON array of "
    "passage numbers only, most relevant first."
)


class LlmReranker:
    """Listwise reranking by a chat model (temperature 0): the passages are numbered from 1,
    the model answers a JSON array of numbers. Prose or code fences around the array,
    repeated or unknown numbers are tolerated; passages it leaves out keep their fused order
    after the ones it ranked. Score: 1 at the top, falling by 1/n a place."""

    provider = "llm"

    def __init__(self, chat: ChatClient, model: str | None = None) -> None:
        self.chat = chat
        self._model = model or chat.model

    @property
    def model(self) -> str:
        return self._model

    def rerank(self, query: str, documents: Sequence[str]) -> list[RerankHit]:
        numbered = "\n\n".join(
            f"[{i}] {' '.join(text.split())}" for i, text in enumerate(documents, 1)
        )
        prompt = (
            f"Query: {query}\n\nPassages:\n{numbered}\n\n"
            f"Rank all {len(documents)} passages by relevance to the query. Answer with a JSON "
            f"array of their numbers, most relevant first, e.g. [2, 1, 3]."
        )
        answer = self.chat.complete(
            [{"role": "system", "content": LLM_RERANK_SYSTEM}, {"role": "user", "content": prompt}],
            temperature=0.0,
            model=self._model,
        )
        positions = as_positions(parse_json_array(answer), len(documents))
        if not positions:
            raise ModelError(
                f"the model ranked none of the {len(documents)} passages: {answer[:120]!r}"
            )
        count = len(documents)
        return [RerankHit(p, 1.0 - place / count) for place, p in enumerate(positions)]


def full_order(hits: Sequence[RerankHit], count: int) -> list[tuple[int, float | None]]:
    """Every position 0..count-1: the reranked ones first, then the rest in fused order."""
    scores = {h.index: h.score for h in hits}
    return [(i, scores.get(i)) for i in fill_order([h.index for h in hits], count)]
