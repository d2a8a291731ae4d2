"""Each test starts with no override registered, no kill switch and no bundle
directory from the environment; it ends with its registrations dropped."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _clean_plugin(monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.delenv("KVPATCH_DISABLE", raising=False)
    monkeypatch.setenv("KVPATCH_PLUGIN_DIR", str(tmp_path / "no-bundle-here"))
    yield
    try:
        from kvpatch.vllm_plugin import plugin
    except ImportError:  # pragma: no cover - torch-less environments skip before this matters
        return
    plugin.reset()
