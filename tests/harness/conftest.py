"""Fixtures of the bench's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def http_server(engines):
    """A real trtserve on 127.0.0.1 serving engines/ with its HTTP door open too (``http_url``),
    shared by the session."""
    from servers import ServerThread

    with ServerThread(engines, http=True) as srv:
        yield srv
