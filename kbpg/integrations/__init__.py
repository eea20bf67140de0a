"""Adapters that put kbpg where users already work, each an optional extra: `langchain`
(kbpg[langchain]) and `llamaindex` (kbpg[llamaindex]), with what they do alike in `shared`
(the search options, the sync and async search, the chunk metadata).

They sit beside kbpg.serve and call kbpg.app's KnowledgeBase; ranking, filtering and the
context block stay in kbpg.search and SQL. Neither adapter imports the other.
"""
