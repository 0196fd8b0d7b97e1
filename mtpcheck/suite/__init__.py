"""The conformance suite: `pytest --pyargs mtpcheck.suite --mtp-backend=NAME`.

Every test carries `@pytest.mark.contract("CLAUSE-ID")`; the plugin skips it
with the missing capability's name when the backend lacks what the clause
requires (catalogue: mtpcheck/catalogue/clauses.toml)."""
