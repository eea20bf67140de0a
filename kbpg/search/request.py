"""One typed search request: every kb.search option, declared and validated once.

The CLI options (`kbpg search`, `kbpg eval`), the HTTP body and the Python API are generated
from the field metadata here. Adding an option means one field below plus its use in the
pipeline.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from kbpg.errors import InvalidInput

if TYPE_CHECKING:
    from kbpg.config import Settings

Kind = Literal["query", "int", "float", "bool", "text", "texts", "filter", "interval"]
_METADATA_KEY = "kbpg"
DEFAULT_SNIPPET = 200  # characters of each chunk around the query's words


_SQL_TYPES: dict[Kind, str] = {
    "query": "text",
    "int": "integer",
    "float": "double precision",
    "bool": "boolean",
    "text": "text",
    "texts": "text[]",
    "filter": "jsonb",
    "interval": "interval",
}


@dataclass(frozen=True)
class Option:
    """How one field of SearchRequest is checked, passed to kb.search and offered to users."""

    kind: Kind
    help: str
    sql: str = ""  # the kb.search parameter it sets (default: the field's name)
    minimum: float | None = None
    maximum: float | None = None
    env: str | None = None  # the setting that supplies the default when the field is None
    default_note: str | None = None  # the default as help shows it, when SQL or env sets it
    flag: str | None = None  # CLI spelling when it is not --field-name
    short: str | None = None
    metavar: str | None = None
    tuning: bool = False  # also an option of `kbpg eval` (ranking knobs, not filters)
    # run in Python around kb.search (a model stage, the snippets), not a kb.search parameter
    in_python: bool = False

    @property
    def sql_type(self) -> str:
        """The cast kbpg writes (explicit casts keep function resolution driver-independent)."""
        return _SQL_TYPES[self.kind]


def _field(
    kind: Kind, help: str, minimum: float | None = None, maximum: float | None = None, **more: Any
) -> Any:
    """A SearchRequest field that defaults to None (kbpg's default), with its Option."""
    option = Option(kind, help, minimum=minimum, maximum=maximum, **more)
    return field(default=None, metadata={_METADATA_KEY: option})


@dataclass(frozen=True)
class SearchRequest:
    """A search: the query and every kb.search option; None means kbpg's default.

    Construction validates every field (InvalidInput on bad values) and normalises lists to
    tuples, empty filter lists to None. A new option is one field here plus its use.
    """

    # fmt: off
    query: str = field(metadata={_METADATA_KEY: Option(
        "query", "The question; plain text, never SQL.", sql="query_text")})
    top: int | None = _field(
        "int", "Number of chunks to return.", 1, 1000, sql="match_count",
        env="KBPG_DEFAULT_MAX_CHUNKS", default_note="8", flag="--top", short="-k")
    groups: tuple[str, ...] | None = _field(
        "texts", "Only documents in group G (repeatable: in any of the groups; public: also "
        "the documents without groups).", flag="--group", metavar="G")
    category: str | None = _field("text", "Only documents of category C.", metavar="C")
    labels: tuple[str, ...] | None = _field(
        "texts", "Only chunks labelled L (repeatable: carrying all of the labels).", flag="--label",
        metavar="L")
    filter: Mapping[str, Any] | None = _field(
        "filter", "Only documents whose metadata matches: a JSON filter with langchain-postgres's "
        "operators ($eq $ne $gt $gte $lt $lte $in $nin $between $exists $like $ilike $and $or "
        "$not), e.g. '{\"year\": {\"$gte\": 2020}}', or the short form KEY=VALUE, KEY>=VALUE "
        "(also != > < <=; repeatable: all hold).", metavar="FILTER")
    recency: str | None = _field(
        "interval", "Favour recent documents: after fusion, a score halves per this much of "
        "its document's age (a half-life such as '30 days'; the date from --recency-key, else "
        "when the document was last ingested).", default_note="off", metavar="HALF-LIFE")
    recency_key: str | None = _field(
        "text", "The metadata key holding a document's date for --recency (an ISO date; dotted "
        "for nested keys).", metavar="KEY")
    min_similarity: float | None = _field(
        "float", "Similarity floor of the vector arm.", -1.0, 1.0,
        default_note="0.30, set in SQL", tuning=True)
    lexical: bool | None = _field(
        "bool", "Run the BM25 arm.", sql="use_lexical", env="KBPG_HYBRID_LEXICAL_ENABLED",
        default_note="on")
    graph: bool | None = _field(
        "bool", "Add the graph arm (edges from the vector hits).", sql="use_graph",
        default_note="off")
    diversity: float | None = _field(
        "float", "Maximal marginal relevance over the fused pool, before the per-document cap: "
        "0 is off, 0.3 trades a little relevance for variety.", 0.0, 1.0,
        default_note="0, set in SQL", tuning=True)
    fusion: str | None = _field(
        "text", "How the arms' lists are fused: rrf (ranks) or convex (min-max normalised scores "
        "with the weights).", default_note="rrf, set in SQL", tuning=True, metavar="rrf|convex")
    fetch_multiplier: int | None = _field(
        "int", "Candidates per arm: top times this.", 1, 100, default_note="4, set in SQL",
        tuning=True)
    max_per_doc: int | None = _field(
        "int", "At most this many chunks of one document in front.", 1, 1000,
        default_note="3, set in SQL", tuning=True)
    rrf_k: int | None = _field(
        "int", "RRF constant k of weight / (k + rank).", 0, 1_000_000,
        default_note="60, set in SQL", tuning=True)
    vector_weight: float | None = _field(
        "float", "RRF weight of the vector arm.", 0.0, 1000.0, default_note="1, set in SQL",
        tuning=True)
    lexical_weight: float | None = _field(
        "float", "RRF weight of the BM25 arm.", 0.0, 1000.0, default_note="1, set in SQL",
        tuning=True)
    graph_weight: float | None = _field(
        "float", "RRF weight of the graph arm.", 0.0, 1000.0, default_note="1, set in SQL",
        tuning=True)
    graph_max_depth: int | None = _field(
        "int", "Graph arm: hops from the seed chunks.", 1, 5, default_note="1, set in SQL",
        tuning=True)
    graph_max_returned: int | None = _field(
        "int", "Graph arm: at most this many chunks.", 0, 1000, default_note="3, set in SQL",
        tuning=True)
    graph_min_score: float | None = _field(
        "float", "Graph arm: path score floor (product of edge weights).", 0.0, 1.0,
        default_note="0.5, set in SQL", tuning=True)
    facets: tuple[str, ...] | None = _field(
        "texts", "Count the documents of the match set per value of FIELD: category, labels, "
        "groups or metadata.KEY (repeatable, or comma-separated).", flag="--facets",
        metavar="FIELD", in_python=True)
    snippet: int | None = _field(
        "int", "Each chunk's snippet: at most this many characters of it around the query's "
        "words, which are marked (kb.highlight; 0: neither).", 0, 10000, default_note="200",
        metavar="CHARS", in_python=True)
    rerank: bool | None = _field(
        "bool", "Rerank the fused candidates with the configured reranker.", env="KBPG_RERANK",
        default_note="on when KBPG_RERANK names a reranker", in_python=True)
    expand: bool | None = _field(
        "bool", "Add the chat model's paraphrases of the question to the vector arm.",
        env="KBPG_EXPAND", default_note="off", in_python=True)
    # fmt: on

    def __post_init__(self) -> None:
        for name in OPTIONS:
            object.__setattr__(self, name, check(name, getattr(self, name)))

    def with_defaults(self, settings: Settings) -> SearchRequest:
        """The request with the settings' defaults filled in where it leaves them open."""
        return replace(
            self,
            top=settings.default_max_chunks if self.top is None else self.top,
            lexical=settings.lexical_enabled if self.lexical is None else self.lexical,
            rerank=settings.models.rerank != "none" if self.rerank is None else self.rerank,
            expand=settings.models.expand if self.expand is None else self.expand,
            snippet=DEFAULT_SNIPPET if self.snippet is None else self.snippet,
        )

    def arguments(self) -> dict[str, Any]:
        """kb.search's named arguments for the fields that are set (SQL defaults elsewhere)."""
        return sql_arguments({name: getattr(self, name) for name in OPTIONS})

    def options(self) -> dict[str, Any]:
        """The fields other than the query that are set, by name (what `search(**options)` took)."""
        return {
            n: getattr(self, n) for n in OPTIONS if n != "query" and getattr(self, n) is not None
        }


OPTIONS: dict[str, Option] = {
    f.name: replace(f.metadata[_METADATA_KEY], sql=f.metadata[_METADATA_KEY].sql or f.name)
    for f in fields(SearchRequest)
}
TUNING_OPTIONS = {name: option for name, option in OPTIONS.items() if option.tuning}


def validate_query(query: object) -> str:
    """The query as given, or InvalidInput when it cannot be searched for."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidInput("the query must not be empty", hint="pass some words to search for")
    if "\x00" in query:
        raise InvalidInput("the query contains a NUL character")
    if not _is_utf8(query):  # lone surrogates: undecodable argv bytes, or JSON "\ud800"
        raise InvalidInput(
            "the query is not valid UTF-8 text", hint="check the terminal's encoding (LANG)"
        )
    return query


def _shown(value: object, width: int = 40) -> str:
    """A value for an error message: its repr, cut (a 60 KB filter is not echoed back)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, not {type(value).__name__}")
    if not value or "\x00" in value or not _is_utf8(value):
        raise InvalidInput(
            f"{name} must be non-empty UTF-8 text without NUL characters, not {_shown(value)}"
        )
    return value


def _check_number(name: str, option: Option, value: object) -> int | float:
    # bool is an int to Python, never to kbpg: `top=True` is a mistake, not 1
    integral = option.kind == "int"
    if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)):
        wanted = "an integer" if integral else "a number"
        raise InvalidInput(f"{name} must be {wanted}, not {_shown(value)}")
    low, high = option.minimum, option.maximum
    if not math.isfinite(value):
        raise InvalidInput(
            f"{name} must be a finite number between {low:g} and {high:g}, not {value!r}",
            hint="NaN and Infinity are not numbers kbpg can rank with",
        )
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidInput(f"{name} must be between {low:g} and {high:g}, not {value!r}")
    return value if integral else float(value)


class FilterObject(dict[str, Any]):
    """A metadata filter as given (a JSON object), read-only and hashable like the frozen
    request that holds it (requests are cache keys)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json.dumps(self, sort_keys=True))

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a search request's filter is read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only


def _check_filter(name: str, value: object) -> dict[str, Any] | None:
    """A metadata filter: a JSON object (its operators are checked in SQL, kb._metadata_jsonpath,
    the one place psql, the CLI, HTTP and the adapters share); {} is no filter."""
    if not isinstance(value, Mapping):
        raise InvalidInput(
            f"{name} must be a JSON object, not {type(value).__name__}",
            hint='for example {"year": {"$gte": 2020}, "lang": "de"}',
        )
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{name} is not JSON: {exc}") from None
    if not _is_utf8(text) or "\\u0000" in text:
        raise InvalidInput(f"{name} must be UTF-8 text without NUL characters")
    filter_ = FilterObject(json.loads(text))
    return filter_ or None


# the short form of a filter, one condition: KEY OP VALUE (the first operator found)
_SHORT_FILTER = re.compile(
    r"^\s*(?P<key>[^=!<>]+?)\s*(?P<op>>=|<=|!=|=|>|<)\s*(?P<value>.*?)\s*$", re.S
)
_SHORT_OPERATORS = {"=": "$eq", "!=": "$ne", ">": "$gt", ">=": "$gte", "<": "$lt", "<=": "$lte"}


def parse_filter(text: str) -> dict[str, Any]:
    """A filter as the CLI takes it: a JSON object, or one condition KEY=VALUE (also !=, >, >=,
    <, <=; VALUE a JSON number, true, false, null or "string", else the text as it is)."""
    if text.lstrip().startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise InvalidInput(
                f"the filter is not valid JSON: {exc}",
                hint='quote it for the shell: --filter \'{"year": {"$gte": 2020}}\'',
            ) from None
        return dict(_check_filter("filter", parsed) or {})
    match = _SHORT_FILTER.match(text)
    if match is None:
        raise InvalidInput(
            f"cannot read the filter {_shown(text)}",
            hint="a JSON object, or KEY=VALUE, KEY>=VALUE (also !=, >, <, <=)",
        )
    raw = match["value"]
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    if isinstance(value, (dict, list)):
        value = raw  # a list or an object is no value to compare with: the text as it is
    op = _SHORT_OPERATORS[match["op"]]
    return {match["key"]: value if op == "$eq" else {op: value}}


def combine_filters(filters: tuple[Mapping[str, Any], ...]) -> dict[str, Any] | None:
    """Several filters that must all hold, as one ($and), or None for none."""
    given = [dict(f) for f in filters if f]
    if not given:
        return None
    return given[0] if len(given) == 1 else {"$and": given}


def check(name: str, value: Any) -> Any:
    """Option `name`'s value, normalised (lists -> tuples, [] -> None), or InvalidInput.

    The one place search options are validated: the dataclass, the HTTP body and `kbpg eval`
    call it.
    """
    option = OPTIONS.get(name)
    if option is None:
        raise InvalidInput(
            f"unknown search option {name!r}", hint=f"use one of {', '.join(OPTIONS)}"
        )
    if option.kind == "query":
        return validate_query(value)
    if value is None:
        return None
    if option.kind in ("int", "float"):
        return _check_number(name, option, value)
    if option.kind == "bool":
        if not isinstance(value, bool):
            raise InvalidInput(f"{name} must be true or false, not {_shown(value)}")
        return value
    if option.kind in ("text", "interval"):  # an interval's syntax is PostgreSQL's to judge
        return _check_text(name, value)
    if option.kind == "filter":
        return _check_filter(name, value)
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InvalidInput(f"{name} must be a list of strings, not {type(value).__name__}")
    items = tuple(_check_text(name, item) for item in value)
    return items or None


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options without a query (kbpg eval runs one set with many queries), validated; None dropped."""
    if "query" in options:
        raise InvalidInput("pass the query on its own, not among the options")
    checked = {name: check(name, value) for name, value in options.items()}
    return {name: value for name, value in checked.items() if value is not None}


def sql_arguments(options: Mapping[str, Any]) -> dict[str, Any]:
    """kb.search's named arguments for validated options; None is left to the SQL default."""
    return {
        OPTIONS[name].sql: _sql_value(value)
        for name, value in options.items()
        if value is not None and not OPTIONS[name].in_python
    }


def _sql_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):  # a filter: JSON text, cast to jsonb by the call
        return json.dumps(value, ensure_ascii=False)
    return value


def sql_types() -> dict[str, str]:
    """kb.search's parameter names and SQL types, for the options SearchRequest can set."""
    return {option.sql: option.sql_type for option in OPTIONS.values() if not option.in_python}
