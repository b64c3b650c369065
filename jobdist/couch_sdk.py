"""Driving the Cloudant SDK: a client per server, and CouchDB's names as the SDK spells them.

A client reads its proxy and CA settings once, sends and accepts no gzip, and logs in with
Basic authentication; `_design/` and `_local/` documents have calls of their own, and view
parameters other names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import requests
from ibm_cloud_sdk_core.authenticators import (
    Authenticator,
    BasicAuthenticator,
    NoAuthAuthenticator,
)
from ibmcloudant import CloudantV1

# CouchDB's view parameter names as the SDK spells them.
_VIEW_PARAMS = {
    "startkey": "start_key",
    "endkey": "end_key",
    "startkey_docid": "start_key_doc_id",
    "endkey_docid": "end_key_doc_id",
}


def new_client(url: str, user: str | None, password: str | None,
               timeout: tuple[float, float]) -> CloudantV1:
    """A client of the server at `url` (without credentials); timeout: (connect, read)."""
    # Basic rather than session (cookie) authentication: it survives a server
    # restart without a 401 and a new login in the middle of a decision.
    authenticator: Authenticator = (NoAuthAuthenticator() if user is None
                                    else BasicAuthenticator(user, password or ""))
    client = CloudantV1(authenticator=authenticator)
    client.set_service_url(url)
    client.set_http_config({"timeout": timeout})
    session = client.get_http_client()
    _environment_once(session, url)
    # No gzip either way: a daemon's server is its site's own, a host or a rack
    # away. pouchdb-server deflated every larger answer (a tenth of its CPU under
    # a burst, with the replicator's, which asked too; CouchDB compresses none),
    # and the SDK gzips every request body, which the server then inflates.
    session.headers["Accept-Encoding"] = "identity"
    client.set_enable_gzip_compression(False)
    return client


def _environment_once(session: requests.Session, url: str) -> None:
    """Read the proxy and CA settings from the environment now, not at every request.

    `requests` scans the environment for them on each call: about a quarter of
    its CPU per request to a local server, on the daemon's hot path.
    """
    session.proxies.update(requests.utils.get_environ_proxies(url))
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        session.verify = bundle
    session.trust_env = False


def json_result(result: Any) -> Any:
    # pouchdb-server sends `_local` documents without a JSON content type, so the
    # SDK hands back the response itself.
    return result.json() if isinstance(result, requests.Response) else result


def split_id(doc_id: str) -> tuple[str, str]:
    """("_design" | "_local" | "", the name the SDK's call for that kind wants)."""
    for kind in ("_design", "_local"):
        if doc_id.startswith(kind + "/"):
            return kind, doc_id[len(kind) + 1 :]
    return "", doc_id


def sdk_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """View and `_all_docs` parameters under the SDK's names (`startkey` → `start_key`)."""
    return {_VIEW_PARAMS.get(name, name): value for name, value in params.items()}
