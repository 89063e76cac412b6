//! kace's SQLite store: schema, migrations, typed queries and the observation spool (filled by the database issue).
