"""The plugin's entry point never hangs or crashes a vLLM process on what it finds on disk: a
bundle whose library is a FIFO or a device (its manifest saying 0 bytes, so that the size check
passes) is a refusal in one warning line, vLLM's kernels stay."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")

import standin as S  # noqa: E402

from kvpatch.vllm_plugin import plugin  # noqa: E402
from kvpatch.vllm_plugin.bundle import MANIFEST  # noqa: E402


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_bundle_library_that_is_not_a_regular_file_is_refused_without_reading_it(kind: str, tmp_path: Path
                                                                                    ) -> None:  # fmt: skip
    ns = S.unique_namespace()
    lib_def = S.define_ops(ns, S.TENSOR_SCALES, [])
    bundle = S.make_bundle(tmp_path / "bundle")
    manifest = json.loads((bundle / MANIFEST).read_text())
    library = bundle / manifest["library"]
    library.unlink()
    if kind == "fifo":
        os.mkfifo(library)
    else:
        library.symlink_to("/dev/zero")  # st_size 0, and a read that never ends
    manifest.update(library_bytes=0, library_sha256=hashlib.sha256(b"").hexdigest())
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    target = S.make_target(ns, bundle, S.FakeLauncher(S.SMALL_SET.labels()))
    box: list = []
    thread = threading.Thread(target=lambda: box.append(plugin.decide(target)), daemon=True)
    thread.start()
    thread.join(20)
    if kind == "fifo" and thread.is_alive():
        os.close(os.open(library, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked reader go
    assert box, f"the plugin's checks blocked on a {kind} as the bundle's library"
    d = box[0]
    assert d.action == "refuse" and "not a regular file" in d.reason, d.line()
    del lib_def
