"""``kvpatch bench-decode`` (kvpatch.cli.decode, kvpatch.commands.decode) before any GPU: its
options, and bad weight-prefetch options refused in one line with exit 2 before the GPU or a
library is looked at; the weight-prefetch knobs over a whole ``--wpf`` configuration."""

from __future__ import annotations

import sys

import pytest

from kvpatch.commands.decode import weight_prefetch_of
from kvpatch.decode.options import MiB, WeightPrefetch
from kvpatch.errors import UsageError


def kvpatch(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``kvpatch ARGS`` in this process, as the console script runs it: (exit code, stdout, stderr)."""
    import kvpatch.cli as cli

    monkeypatch.setattr(cli, "_install_signals", lambda: None)  # the test process keeps its own handlers
    monkeypatch.setattr(sys, "argv", ["kvpatch", *args])
    monkeypatch.setenv("COLUMNS", "250")
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        cli.run()
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def test_bench_decode_help_lists_its_options(monkeypatch, capsys):
    code, out, err = kvpatch(monkeypatch, capsys, "bench-decode", "--help")
    assert code == 0, err
    for opt in ("--lib", "--libs-file", "--models", "--dtypes", "--batches", "--contexts", "--layers", "--rounds",
                "--cycles", "--wpf", "--cap", "--grid", "--threads", "--chunk", "--hint", "--fork", "--join", "--priority",
                "--tail", "--aa", "--zero", "--guard", "--prefetch-lib", "--cold", "--micro", "--json", "--plot", "--text"):  # fmt: skip
        assert opt in out, opt
    code, out, _ = kvpatch(monkeypatch, capsys, "--help")
    assert (
        code == 0 and "bench-decode" in out and "bench-decode-sweep" not in out
    )  # the sweep is a maintainer's command
    code, out, _ = kvpatch(monkeypatch, capsys, "bench-decode-sweep", "--help")
    assert code == 0 and "--budget" in out and "--stages" in out


@pytest.mark.parametrize(("args", "says"), [
    (("--cap", "1:x"), "invalid cap"),
    (("--cap", "9" * 5000 + ":8"), "invalid cap"),  # more digits than int() takes
    (("--hint", "sticky"), "hint"),
    (("--wpf", "oproj->down=8"), "unknown prefetch window"),
    (("--wpf", "cap=8;oproj->gateup=8"), "either windows"),
    (("--grid", "8;threads=64"), "one value"),
    (("--guard", "maybe"), "--guard"),
    (("--tail", "8@evict_never"), "invalid --tail"),
    (("--models", "llama-4"), "unknown model"),
    (("--dtypes", "fp32"), "invalid dtype"),
])  # fmt: skip
def test_bad_options_are_one_line_errors_before_the_gpu(monkeypatch, capsys, args, says):
    code, out, err = kvpatch(monkeypatch, capsys, "bench-decode", "--lib", "stock=/nonexistent.so:p", *args)
    assert code == 2 and out == "", err
    assert err.strip().count("\n") == 0 and says in err and err.startswith("error: kvpatch bench-decode: "), err


def test_knobs_apply_over_a_whole_configuration():
    w = weight_prefetch_of({"wpf": "gateup->down=8@evict_normal;grid=16", "threads": 128, "join": "oproj"})
    assert [x.text() for x in w.windows] == ["gateup->down=8@evict_normal"] and (w.grid, w.threads, w.join) == (
        16,
        128,
        "oproj",
    )
    assert weight_prefetch_of({"wpf": "grid=16", "grid": "auto"}).grid is None  # the knob wins
    assert weight_prefetch_of({}) == WeightPrefetch()  # nothing given: the default windows
    first = weight_prefetch_of({"cap": "1:32,8:16", "fork": "qkv"})
    assert first.windows == () and first.caps == {1: 32 * MiB, 8: 16 * MiB} and first.fork == "qkv"
    assert weight_prefetch_of({"cap": "off"}).off()
    with pytest.raises(UsageError, match="unknown weight-prefetch option"):
        weight_prefetch_of({"size": 3})


def test_a_first_form_knob_beside_windows_is_refused_not_dropping_them():
    """Before: --cap or --fork beside a --wpf that gives windows switched to the first form and
    dropped the windows silently (as one --wpf with both is refused). After: refused, one line; a
    --wpf without windows still takes them (its other settings kept)."""
    for knob in ({"fork": "qkv"}, {"cap": "8"}, {"cap": "8", "fork": "qkv"}):
        with pytest.raises(UsageError, match=r"^--wpf gives windows and --(cap|fork)(/--fork)? the first form"):
            weight_prefetch_of({"wpf": "oproj->gateup=8", **knob})
    first = weight_prefetch_of({"wpf": "grid=16", "cap": "8", "fork": "qkv"})
    assert first.windows == () and first.caps == 8 * MiB and (first.fork, first.grid) == ("qkv", 16)
