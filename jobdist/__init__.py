"""jobdist: a multi-site job distributor on replicated CouchDB."""

__version__ = "0.1.0"
