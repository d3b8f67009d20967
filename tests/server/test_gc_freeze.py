"""The server freezes its startup heap once it is ready (server/app.py): the collector never
walks the ~10^5 objects of torch, the models and the app in the middle of serving."""

from __future__ import annotations

import gc

from tests.server.conftest import LiveServer, make_settings


def test_the_startup_heap_is_frozen_once_the_server_is_ready(models_dir):
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    with LiveServer(make_settings(models_dir, gc_freeze=True)):
        frozen = gc.get_freeze_count()
    gc.unfreeze()  # (the test process goes on with other tests)
    assert frozen > 10_000
    with LiveServer(make_settings(models_dir, gc_freeze=False)):
        assert gc.get_freeze_count() == 0
