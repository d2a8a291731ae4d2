"""The release's checkout under ``.kvpatch/``: a damaged object in the cache is one line naming
the cache entry to delete; an empty checkout directory (a killed first apply) is checked out
again. No network: a file:// package index holding the fixture header."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER, STOCK, fixture_text, git, golden_text
from source_helpers import sdist_index

pytestmark = pytest.mark.slow  # a release fetched (from a local index) and applied


def _env(tmp_path: Path) -> dict[str, str]:
    index = sdist_index(tmp_path / "index", extra={HEADER: fixture_text(STOCK)})
    return {"KVPATCH_CACHE": str(tmp_path / "cache"), "PIP_INDEX_URL": index.as_uri()}


def test_a_truncated_object_in_the_cache_names_the_entry_to_delete(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = _env(tmp_path)
    remote = ["--remote", str(tmp_path / "no-remote.git")]
    assert run_cli("apply", "--vllm", "0.10.2", *remote, cwd=work, env=env).returncode == 0
    release = tmp_path / "cache" / "releases" / "v0.10.2"
    blob = git(release, "rev-parse", f"HEAD:{HEADER}").strip()
    obj = release / ".git" / "objects" / blob[:2] / blob[2:]
    obj.chmod(0o644)
    obj.write_bytes(obj.read_bytes()[:10])
    other = tmp_path / "other-work"
    other.mkdir()
    proc = run_cli("apply", "--vllm", "0.10.2", *remote, cwd=other, env=env)
    assert_one_line_error(proc, 1, "could not check out v0.10.2", f"delete {release}")
    assert not list(other.glob(".kvpatch/vllm-*"))


def test_an_empty_checkout_dir_is_repaired(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / ".kvpatch/vllm-0.10.2").mkdir(parents=True)
    proc = run_cli("apply", "--vllm", "0.10.2", "--remote", str(tmp_path / "nothing.git"), cwd=work, env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (work / ".kvpatch/vllm-0.10.2" / HEADER).read_text() == golden_text("default")
