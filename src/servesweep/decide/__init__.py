"""Every decision a user meets, in one place, as pure functions over plain records.

See docs/architecture.md ("Where each decision is made") for which module decides
what; sweep, search and report use these modules and decide nothing of their own.
This package imports nothing above it (sweep, search, report, bench, servers, store,
cli): only spec, models, metrics_catalog, records and errors.
"""
