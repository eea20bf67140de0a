"""Table sources' triggers at statement level, evaluating none of the application's code.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03

Issue 38: kb._source_enqueue (SECURITY DEFINER) read a changed row with to_jsonb(new), which
runs a cast to json the application wrote for a type of its own, as kbpg's owner. From here
the triggers are statement triggers with transition tables (one per event: insert, update,
delete; truncate as before; row triggers on a partitioned table, inherited by its partitions),
and kb._source_enqueue (sql/090, applied after this revision in the same transaction) takes
keys and compared values as text through built-in code only.

Every existing source's triggers are re-created here where the migrating role may (TRIGGER on
the table). Where it may not, the row triggers made by 0014 stay: kb._source_enqueue handles a
row trigger safely too (the row passed as a value, its columns read the same way), only slower
on bulk writes; a warning names the statement a role with TRIGGER on the table runs
(kb.resync_table_source re-creates them). The downgrade puts row triggers back (one for insert,
update and delete; the previous package's kb.resync_table_source makes 0014's three).
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

UPGRADE = r"""
do $$
declare
    s record;
    t text;
    prefix text;
begin
    for s in select x.id, x.name, x.relation, c.relkind
               from kb.table_sources x
               join pg_catalog.pg_class c on c.oid = x.relation
              order by x.id loop
        prefix := 'kbpg_' || s.name;
        if not pg_catalog.has_table_privilege(s.relation, 'TRIGGER') then
            raise warning 'the triggers of table source "%" on % stay row triggers (slower on bulk writes)',
                    s.name, s.relation
                using hint = format('a role with TRIGGER on %s runs: select kb.resync_table_source(%L);',
                                    s.relation, s.name);
            continue;
        end if;
        foreach t in array array[prefix || '_change', prefix || '_update', prefix || '_rekey',
                                 prefix || '_insert', prefix || '_delete'] loop
            execute format('drop trigger if exists %I on %s', t, s.relation);
        end loop;
        if s.relkind = 'p' then
            execute format('create trigger %I after insert on %s for each row '
                           'execute function kb._source_enqueue(%L)', prefix || '_insert', s.relation, s.id);
            execute format('create trigger %I after update on %s for each row '
                           'execute function kb._source_enqueue(%L)', prefix || '_update', s.relation, s.id);
            execute format('create trigger %I after delete on %s for each row '
                           'execute function kb._source_enqueue(%L)', prefix || '_delete', s.relation, s.id);
        else
            execute format('create trigger %I after insert on %s referencing new table as kbpg_new '
                           'for each statement execute function kb._source_enqueue(%L)',
                           prefix || '_insert', s.relation, s.id);
            execute format('create trigger %I after update on %s referencing old table as kbpg_old '
                           'new table as kbpg_new for each statement execute function kb._source_enqueue(%L)',
                           prefix || '_update', s.relation, s.id);
            execute format('create trigger %I after delete on %s referencing old table as kbpg_old '
                           'for each statement execute function kb._source_enqueue(%L)',
                           prefix || '_delete', s.relation, s.id);
        end if;
    end loop;
end
$$;
drop function if exists kb._source_comparison(regclass, text);
"""


def upgrade() -> None:
    op.get_bind().execution_options(no_parameters=True).exec_driver_sql(UPGRADE)


DOWNGRADE = r"""
do $$
declare
    s record;
    t text;
    prefix text;
begin
    for s in select x.id, x.name, x.relation from kb.table_sources x
               join pg_catalog.pg_class c on c.oid = x.relation order by x.id loop
        prefix := 'kbpg_' || s.name;
        if pg_catalog.has_table_privilege(s.relation, 'TRIGGER') then
            foreach t in array array[prefix || '_insert', prefix || '_update', prefix || '_delete'] loop
                execute format('drop trigger if exists %I on %s', t, s.relation);
            end loop;
            execute format('create trigger %I after insert or update or delete on %s for each row '
                           'execute function kb._source_enqueue(%L)', prefix || '_change', s.relation, s.id);
        end if;
    end loop;
end
$$;
"""


def downgrade() -> None:
    op.get_bind().execution_options(no_parameters=True).exec_driver_sql(DOWNGRADE)
