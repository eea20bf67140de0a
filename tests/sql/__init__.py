"""The SQL functions of schema kb, called directly: ranked ids and scores on hand-built data, errors, the catalog, migrations, layouts."""
