"""A proxy.py plugin for tests: a forward proxy that names itself to the sites it reaches.

Each plain-HTTP request the proxy forwards gets the header ``X-Test-Egress`` with the name
in its process's ``EGRESS_TAG`` environment variable, so a local test site can refuse one
egress the way a real site refuses one exit address (``Behaviour.block_egress``). Start the
proxy with ``--plugins sites.egress_tag.EgressTagPlugin``. Tests only: nothing of the
pipeline imports it.
"""

from __future__ import annotations

import os

from proxy.http.parser import HttpParser
from proxy.http.proxy import HttpProxyBasePlugin


class EgressTagPlugin(HttpProxyBasePlugin):
    def handle_client_request(self, request: HttpParser) -> HttpParser | None:
        # Every request of a kept-alive connection passes here (the upstream-connection
        # hook runs once per connection only).
        if not request.has_header(b"X-Test-Egress"):
            request.add_header(b"X-Test-Egress", os.environ.get("EGRESS_TAG", "").encode())
        return request
