"""deploy/ray/serve.yaml is a valid Ray Serve config whose import path and router resolve."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray.serve", reason="ray[serve] is not installed (pip install -e .[ray])")

from ray.serve._private.utils import import_attr  # noqa: E402
from ray.serve.schema import ServeDeploySchema  # noqa: E402

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "ray" / "serve.yaml"


def test_serve_config_validates_and_resolves():
    cfg = ServeDeploySchema.model_validate(yaml.safe_load(CONFIG.read_text()))
    (app,) = cfg.applications
    assert callable(import_attr(app.import_path))
    (dep,) = app.deployments
    assert dep.autoscaling_config["max_replicas"] > dep.autoscaling_config["min_replicas"]
    router = dep.request_router_config["request_router_class"]
    assert import_attr(router).__name__ == "ConsistentHashRouter"
