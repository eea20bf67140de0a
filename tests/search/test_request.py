"""SearchRequest: every kb.search option validated in one place, and mapped onto CLI and HTTP."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest
from click.testing import CliRunner

from kbpg.cli import main
from kbpg.config import Settings
from kbpg.errors import InvalidInput
from kbpg.search.request import OPTIONS, TUNING_OPTIONS, SearchRequest, check_options

VALID: list[dict[str, Any]] = [
    {"query": "renew permit"},
    {"query": "x", "top": 1},
    {"query": "x", "top": 1000},
    {"query": "x", "groups": ["public", "staff"], "labels": ("howto",), "category": "parking"},
    {"query": "x", "min_similarity": -1.0},
    {"query": "x", "min_similarity": 1},  # an int is a fine float
    {"query": "x", "lexical": False, "graph": True},
    {"query": "x", "fetch_multiplier": 100, "max_per_doc": 1, "rrf_k": 0},
    {"query": "x", "vector_weight": 0.0, "lexical_weight": 2.5, "graph_weight": 1},
    {"query": "x", "graph_max_depth": 5, "graph_max_returned": 0, "graph_min_score": 1.0},
    {"query": "図書館カード"},
]

INVALID: list[tuple[dict[str, Any], str]] = [
    ({"query": ""}, "the query must not be empty"),
    ({"query": " \t\n"}, "the query must not be empty"),
    ({"query": "a\x00b"}, "NUL"),
    ({"query": "caf\udce9"}, "not valid UTF-8"),
    ({"query": 42}, "the query must not be empty"),
    ({"query": "x", "top": 0}, "top must be between 1 and 1000"),
    ({"query": "x", "top": 1001}, "top must be between 1 and 1000"),
    ({"query": "x", "top": True}, "top must be an integer"),
    ({"query": "x", "top": 2.0}, "top must be an integer"),
    ({"query": "x", "top": "5"}, "top must be an integer"),
    ({"query": "x", "groups": "staff"}, "groups must be a list of strings"),
    ({"query": "x", "groups": [""]}, "groups must be non-empty"),
    ({"query": "x", "groups": ["a\x00"]}, "without NUL"),
    ({"query": "x", "labels": [1]}, "labels must be a string"),
    ({"query": "x", "labels": ["\udce9"]}, "UTF-8"),
    ({"query": "x", "category": ""}, "category must be non-empty"),
    ({"query": "x", "category": ["a"]}, "category must be a string"),
    ({"query": "x", "min_similarity": 1.5}, "min_similarity must be between -1 and 1"),
    ({"query": "x", "min_similarity": math.nan}, "min_similarity must be a finite number"),
    ({"query": "x", "lexical_weight": math.nan}, "lexical_weight must be a finite number"),
    ({"query": "x", "lexical_weight": -math.inf}, "lexical_weight must be a finite number"),
    ({"query": "x", "min_similarity": False}, "min_similarity must be a number"),
    ({"query": "x", "lexical": 1}, "lexical must be true or false"),
    ({"query": "x", "graph": "yes"}, "graph must be true or false"),
    ({"query": "x", "fetch_multiplier": 101}, "fetch_multiplier must be between 1 and 100"),
    ({"query": "x", "max_per_doc": 0}, "max_per_doc must be between 1"),
    ({"query": "x", "rrf_k": -1}, "rrf_k must be between 0"),
    ({"query": "x", "vector_weight": -0.1}, "vector_weight must be between 0"),
    ({"query": "x", "graph_weight": math.inf}, "graph_weight must be a finite number"),
    ({"query": "x", "graph_max_depth": 6}, "graph_max_depth must be between 1 and 5"),
    ({"query": "x", "graph_min_score": 1.1}, "graph_min_score must be between 0 and 1"),
]


@pytest.mark.parametrize("fields", VALID, ids=range(len(VALID)))
def test_valid_requests(fields: dict[str, Any]) -> None:
    request = SearchRequest(**fields)
    assert request.query == fields["query"]
    for name in ("groups", "labels"):
        value = getattr(request, name)
        assert value is None or isinstance(value, tuple)
    assert hash(request)  # frozen and hashable: a cache key for later stages


@pytest.mark.parametrize(("fields", "message"), INVALID, ids=range(len(INVALID)))
def test_invalid_requests(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        SearchRequest(**fields)
    assert message in info.value.message


def test_long_bad_values_are_not_echoed() -> None:
    with pytest.raises(InvalidInput) as info:
        SearchRequest("x", groups=["ok", "\x00" * 60_000])
    assert len(info.value.message) < 200


def test_empty_filter_lists_mean_no_filter() -> None:
    request = SearchRequest("x", groups=[], labels=())
    assert request.groups is None and request.labels is None
    assert "groups" not in request.arguments()


def test_arguments_map_onto_kb_search_names() -> None:
    request = SearchRequest(
        "renew", top=3, groups=["a"], lexical=False, graph=True, rrf_k=10, graph_max_depth=2
    )
    assert request.arguments() == {
        "query_text": "renew",
        "match_count": 3,
        "groups": ["a"],
        "use_lexical": False,
        "use_graph": True,
        "rrf_k": 10,
        "graph_max_depth": 2,
    }


def test_settings_fill_the_open_defaults() -> None:
    settings = dataclasses.replace(Settings.from_env(), default_max_chunks=6, lexical_enabled=False)
    filled = SearchRequest("x").with_defaults(settings)
    assert (filled.top, filled.lexical) == (6, False)
    kept = SearchRequest("x", top=2, lexical=True).with_defaults(settings)
    assert (kept.top, kept.lexical) == (2, True)


def test_check_options_for_eval() -> None:
    assert check_options({"rrf_k": 10, "min_similarity": None}) == {"rrf_k": 10}
    with pytest.raises(InvalidInput, match="rrf_k must be between"):
        check_options({"rrf_k": -5})
    with pytest.raises(InvalidInput, match="unknown search option 'bogus'"):
        check_options({"bogus": 1})
    with pytest.raises(InvalidInput, match="query"):
        check_options({"query": "x"})


def test_every_option_is_declared_completely() -> None:
    for name, option in OPTIONS.items():
        assert option.help.endswith("."), name
        if option.kind in ("int", "float"):
            assert option.minimum is not None and option.maximum is not None, name
    assert set(TUNING_OPTIONS) >= {"min_similarity", "fetch_multiplier", "rrf_k", "max_per_doc"}


# the options run in Python that `kbpg eval` offers as arms of their own
MODEL_STAGES = {"rerank", "expand"}


def test_cli_offers_every_option() -> None:
    search_help = CliRunner().invoke(main, ["search", "--help"]).stdout
    eval_help = CliRunner().invoke(main, ["eval", "--help"]).stdout
    for name, option in OPTIONS.items():
        if name == "query":
            continue
        flag = re.compile(re.escape(option.flag or "--" + name.replace("_", "-")) + r"(?![\w-])")
        assert flag.search(search_help), flag
        # tuning knobs are eval options; a model stage (--rerank, --expand) is an eval arm
        assert bool(flag.search(eval_help)) == (name in TUNING_OPTIONS or name in MODEL_STAGES), (
            flag
        )


def test_http_body_has_every_option() -> None:
    from kbpg.serve.http import SearchRequest as Body

    assert set(Body.model_fields) == set(OPTIONS) | {"kb", "kbs"}  # and which knowledge base(s)
    schema = Body.model_json_schema()
    assert schema["required"] == ["query"]
    top = next(s for s in schema["properties"]["top"]["anyOf"] if s["type"] == "integer")
    assert (top["minimum"], top["maximum"]) == (1, 1000)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--group", ""], "groups must be non-empty"),
        (["--category", "a\x00b"], "category must be non-empty"),
        (["--rrf-k", "-1"], "--rrf-k"),
        (["--graph-max-depth", "9"], "--graph-max-depth"),
        (["--lexical-weight", "nan"], "'nan' is not a finite number"),
        (["--vector-weight", "inf"], "'inf' is not a finite number"),
        (["--min-similarity", "NaN"], "'NaN' is not a finite number"),
    ],
)
def test_cli_rejects_bad_options_as_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["search", "permit", *args])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert message in result.stderr


@pytest.mark.parametrize("variable", ["KBPG_DATABASE_URL", "KBPG_READ_URL"])
def test_a_url_with_bytes_that_are_not_utf8_is_an_error_with_a_hint(variable: str) -> None:
    # os.environ keeps undecodable bytes as lone surrogates: b"\xff" -> "\udcff"
    env = {variable: "postgresql://kb\udcff@localhost/kb"}
    result = CliRunner().invoke(main, ["stats"], env=env)
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr.splitlines() == [
        f"Error: {variable} holds bytes that are not UTF-8",
        "Hint: percent-encode them in the URL (e.g. %C3%A9 for é) or set the variable as UTF-8",
    ]
