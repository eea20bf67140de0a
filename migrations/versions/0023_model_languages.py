"""The embedding space records which languages its model knows.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03

`kb.embedding_space.languages`: the knowledge-base languages (kb.language names) its model
knows, `english` standing for every configuration that analyses words with English or simple
dictionaries; NULL: every language. kb.search's vector arm gets weight 0 by default when the
knowledge base's language is not among them (kb._default_vector_weight, sql/015): an English-only
model on Russian text is noise that RRF mixes in (XQuAD Russian: hybrid .624 against lexical
.948). An existing all-MiniLM-L6-v2 space is marked English. Signature change (CHANGELOG):
`kb.set_embedding_space` and `kb.reset_embedding_space` gain `model_languages text[]`; the old
signatures are dropped here, the new functions are created from sql/ at head.
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

UPGRADE = r"""
alter table kb.embedding_space add column languages text[];
comment on column kb.embedding_space.languages is
    'The knowledge-base languages its model knows (english: every configuration built on '
    'English or simple dictionaries); NULL: every language.';
update kb.embedding_space set languages = array['english'] where model = 'all-MiniLM-L6-v2';
drop function if exists kb.set_embedding_space(text, integer, text);
drop function if exists kb.reset_embedding_space(text, integer, text);
"""

DOWNGRADE = r"""
drop function if exists kb.set_embedding_space(text, integer, text, text[]);
drop function if exists kb.reset_embedding_space(text, integer, text, text[]);
drop function if exists kb._default_vector_weight();
drop function if exists kb._language_is_english(text);
alter table kb.embedding_space drop column languages;
"""


def upgrade() -> None:
    op.get_bind().exec_driver_sql(UPGRADE)


def downgrade() -> None:
    op.get_bind().exec_driver_sql(DOWNGRADE)
