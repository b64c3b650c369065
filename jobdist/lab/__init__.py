"""The lab: local multi-site clusters on pouchdb-server, the thesis's scenarios,
the demo and the benchmarks.

Everything here serves development, evaluation and tests. The product (the
site daemon and the operator commands) never imports it: a test checks, and
the `jobdist` command loads these commands only when one of them is run.
"""
