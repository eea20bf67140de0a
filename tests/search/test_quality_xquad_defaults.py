"""Quality gate: a language a user names and nothing else (`kbpg eval DATASET --language L`, no
model): XQuAD German and Spanish get the language's default model (multilingual-e5-small) and
the hybrid is never below its own lexical arm by more than .01. Russian, Chinese (ingested with
e5, then switched to their language) and English (its default, MiniLM) are gated in
test_quality_xquad.py; this module runs on another test worker.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kbpg import evaluate as ev
from tests.conftest import QUALITY_SUMMARY
from tests.search.test_quality_xquad import NDCG, collection_dir

pytestmark = pytest.mark.slow

# `kbpg eval DATASET --language L`, no model named: what a user of the language gets by default
DEFAULT_LANGUAGES = {
    "xquad-de": ("german", "multilingual-e5-small"),
    "xquad-es": ("spanish", "multilingual-e5-small"),
}
DEFAULTS_TITLE = "XQuAD with only the language given (nDCG@10, kbpg eval --language)"


@pytest.mark.parametrize("name", list(DEFAULT_LANGUAGES))
def test_the_language_default_is_never_below_its_lexical_arm(
    name: str, admin_url: str, record_property: Any
) -> None:
    language, model = DEFAULT_LANGUAGES[name]
    started = time.perf_counter()
    report = ev.evaluate(
        admin_url, ev.load_beir(collection_dir(name)), None, arms=("hybrid", "lexical"),
        language=language,
    )  # fmt: skip
    lexical, hybrid = (report.metrics[arm][NDCG] for arm in ("lexical", "hybrid"))
    summary = (
        f"{name} --language {language} ({report.model}, {time.perf_counter() - started:.0f} s): "
        f"lexical {lexical:.3f}, hybrid {hybrid:.3f}"
    )
    record_property(QUALITY_SUMMARY, (DEFAULTS_TITLE, [summary]))
    assert (report.language, report.model, report.notes) == (language, model, ())
    assert lexical >= 0.94
    assert hybrid >= lexical - 0.01
