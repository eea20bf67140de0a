"""LangChain's own standard retriever tests (langchain-tests) against kbpg over samples/kb."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_tests.integration_tests import RetrieversIntegrationTests

from kbpg.app import KnowledgeBase
from kbpg.integrations.langchain import KbpgRetriever


class TestKbpgRetrieverStandard(RetrieversIntegrationTests):
    """test_k_constructor_param, test_invoke_with_k_kwarg, test_invoke_returns_documents,
    test_ainvoke_returns_documents and test_no_overrides_DO_NOT_OVERRIDE, as LangChain wrote
    them; only the constructor and its arguments are ours."""

    @pytest.fixture(autouse=True)
    def _samples(self, samples_kb: KnowledgeBase) -> None:
        self.knowledge_base = samples_kb

    @property
    def retriever_constructor(self) -> type[KbpgRetriever]:
        return KbpgRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"knowledge_base": self.knowledge_base}

    @property
    def retriever_query_example(self) -> str:
        return "how do I renew a parking permit"

    @property
    def num_results_arg_name(self) -> str:
        return "top"
