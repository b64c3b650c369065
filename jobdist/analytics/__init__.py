"""`jobdist report`: job analytics on Spark, from a site's CouchDB to tables and one
HTML page (docs/analytics.md). `source` reads the documents into rows, `tables`
derives the tables and the summary, `page` draws the report and is the command."""

from jobdist.analytics.page import report

__all__ = ["report"]
