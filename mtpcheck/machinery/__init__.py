"""The suite machinery (docs/architecture.md): the checks the suite and the
plugin call (checks, assertions, scheduling), the guarded backend and profiles
(harness), the report, hypothesis strategies and the golden snapshots. Below
the plugin and the suite; above engine, laws, contracts and backends."""
