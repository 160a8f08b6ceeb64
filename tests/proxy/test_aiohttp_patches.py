"""The private aiohttp names clawproxy/proxy/aiohttp_patches.py relies on are still there and shaped
the same; an aiohttp upgrade that moves them fails here first. Behaviour: test_reliability_requests.py
(test_error_answers_are_json_even_from_the_http_parser, test_non_utf8_header_bytes_are_forwarded_intact)."""

from __future__ import annotations

import inspect

from aiohttp import http_writer, web
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict

from clawproxy.proxy import aiohttp_patches


def test_handle_error_is_still_the_protocol_layers_error_path():
    aiohttp_patches.install()
    orig = inspect.unwrap(RequestHandler.handle_error)
    assert orig is not RequestHandler.handle_error  # patched, and the original kept
    assert list(inspect.signature(orig).parameters) == ["self", "request", "status", "exc", "message"]
    # Parser errors and unexpected handler exceptions both end in it.
    assert "self.handle_error(" in inspect.getsource(RequestHandler._make_error_handler)
    assert "self.handle_error(request, 500, exc)" in inspect.getsource(RequestHandler._handle_request)
    # The patch finds the app through the request factory, a bound method of the Application.
    assert "request_factory=self._make_request" in inspect.getsource(web.Application._make_handler)


def test_the_header_writer_is_still_one_module_level_function():
    aiohttp_patches.install()
    assert "_serialize_headers(status_line, headers)" in inspect.getsource(http_writer.StreamWriter.write_headers)
    assert callable(http_writer._safe_header)
    orig = inspect.unwrap(http_writer._serialize_headers)
    assert orig is not http_writer._serialize_headers
    headers = CIMultiDict({"Authorization": "Bearer sk-\udce9\udcff", "X-A": "b"})
    # aiohttp's own writer still drops the bytes (else the patch can go) ...
    assert b"sk-\xe9\xff" not in orig("POST / HTTP/1.1", headers)
    # ... and ours keeps them, leaving plain headers to aiohttp byte for byte.
    assert b"Authorization: Bearer sk-\xe9\xff\r\n" in http_writer._serialize_headers("POST / HTTP/1.1", headers)
    plain = CIMultiDict({"X-A": "b"})
    assert http_writer._serialize_headers("GET / HTTP/1.1", plain) == orig("GET / HTTP/1.1", plain)


def test_install_is_idempotent():
    aiohttp_patches.install()
    first = RequestHandler.handle_error, http_writer._serialize_headers
    aiohttp_patches.install()
    assert (RequestHandler.handle_error, http_writer._serialize_headers) == first
