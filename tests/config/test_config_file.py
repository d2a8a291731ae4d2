"""``kvpatch.toml``: what dump_config writes, what load_config_file reads, and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpatch.config import config_and_tuned, dump_config, load_config_file, make_config
from kvpatch.errors import UsageError


def test_dump_config_writes_a_complete_table() -> None:
    cfg = make_config(
        inherit_rules=False,
        fp16="scope=kv-head,issue=inline",
        rules={"bf16/80/32": "off", "fp16/64/16/auto/v2": "lookahead=2"},
    )
    assert dump_config(cfg) == (
        "[kvpatch]\n"
        'preset = "default"\n'
        "lookahead = 1\n"
        'size = "auto"\n'
        "align = 16\n"
        'caches = "kv"\n'
        'cache-hint = "none"\n'
        'placement = "start"\n'
        'scope = "cta"\n'
        "min-group = 1\n"
        "min-ctas = 1\n"
        "min-kv-mib = 0\n"
        'issue = "call"\n'
        'read = "lane"\n'
        "group = 1\n"
        "group-min-ctas = 1\n"
        "group-ctas-per-sm = 0\n"
        "group-half-below = 2\n"
        "group-fit-ctas = 0\n"
        'group-logits = "shared"\n'
        'group-v-loads = "at-use"\n'
        'group-k-loads = "at-use"\n'
        "control = false\n"
        'quantized = "skip"\n'
        "inherit-rules = false\n"
        'bf16 = "none"\n'
        'fp32 = "none"\n'
        "\n"
        "[kvpatch.fp16]\n"
        'scope = "kv-head"\n'
        'issue = "inline"\n'
        "\n"
        "[kvpatch.rules]\n"
        '"bf16/80/32" = { off = true }\n'
        '"fp16/64/16/auto/v2" = { lookahead = 2 }\n'
    )


def test_a_dumped_file_reads_back_the_same_whatever_the_default_rules(tmp_path, monkeypatch) -> None:
    """inherit-rules = false: a written file is complete, so a later kvpatch with other default rules
    reads it back unchanged (and the shipped default round-trips too)."""
    import kvpatch.config.make as M

    path = tmp_path / "kvpatch.toml"
    other = (("fp32", (("lookahead", 3),)), ("*/*/8", (("off", True),)))
    for cfg in (make_config(), make_config(inherit_rules=False, issue="inline")):
        path.write_text(dump_config(cfg))
        monkeypatch.setattr(M, "DEFAULT_OVERRIDES", other)
        assert make_config().overrides == tuple(sorted(other))  # another kvpatch's default rules
        assert make_config(**load_config_file(path)) == cfg
        monkeypatch.undo()
    assert make_config(**load_config_file(path)) == make_config(inherit_rules=False, issue="inline")
    with pytest.raises(UsageError, match="invalid inherit-rules"):
        make_config(inherit_rules="no")


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"lookahead": 3, "size": 8192, "align": 256, "caches": "k", "cache_hint": "evict_last",
         "placement": "end", "scope": "kv-head", "control": True},
        pytest.param(
            {"preset": "paper"}
        ),
    ],
    ids=["default", "everything-set", "paper"],
)  # fmt: skip
def test_toml_round_trip(options: dict, tmp_path: Path) -> None:
    cfg = make_config(**options)
    path = tmp_path / "kvpatch.toml"
    path.write_text(dump_config(cfg), encoding="utf-8")
    assert make_config(**load_config_file(path)) == cfg


@pytest.mark.parametrize(
    "text",
    [
        'lookahead = 2\ncache-hint = "evict_last"\nsize = 8192\n',
        '[kvpatch]\nlookahead = 2\ncache_hint = "evict_last"\nsize = 8192\n',
        '# a comment\n[kvpatch]\nlookahead = 2\ncache-hint = "evict_last"\nsize = 8192\n',
    ],
    ids=["top-level-dashes", "table-underscores", "table-dashes"],
)
def test_load_config_file(text: str, tmp_path: Path) -> None:
    path = tmp_path / "kvpatch.toml"
    path.write_text(text, encoding="utf-8")
    assert load_config_file(path) == {"lookahead": 2, "cache_hint": "evict_last", "size": 8192}
    cfg = make_config(**load_config_file(path))
    assert cfg == config_and_tuned(None, lookahead=2, cache_hint="evict_last", size=8192)[0]  # as on the command line
    assert (cfg.lookahead, cfg.cache_hint, cfg.size) == (2, "evict_last", 8192)
    # base settings a user gives replace the shipped table's values where it prefetches; it still decides which do
    tuned = {k: c for k, _, c in make_config().kernel_variants()}
    for kernel, c in ((k, c) for k, _, c in cfg.kernel_variants()):
        assert c.off == tuned[kernel].off and (c.off or (c.lookahead, c.cache_hint, c.size) == (2, "evict_last", 8192))
    assert (
        make_config().resolve("bf16", 128, 16, "auto", "v1").lookahead == 1
        and cfg.resolve("bf16", 128, 16, "auto", "v1").lookahead == 2
    )


def test_unknown_key_in_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "kvpatch.toml"
    path.write_text("[kvpatch]\nlook-ahead = 2\ncaches = 'k'\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"^unknown configuration key\(s\): look-ahead$"):
        make_config(**load_config_file(path))


def test_an_unknown_key_is_said_as_written_and_quoted_where_its_spaces_would_not_show(tmp_path: Path) -> None:
    """Before: a key with a trailing space was said as the setting's field name (``group_v_loads``),
    which reads as if the setting itself were unknown; a rule's said ``cannot override group-v-loads ``
    beside ``only ..., group-v-loads``. After: each is quoted."""
    path = tmp_path / "kvpatch.toml"
    path.write_text('[kvpatch]\n"group-v-loads " = "ahead"\n', encoding="utf-8")
    with pytest.raises(UsageError, match=r"^unknown configuration key\(s\): 'group-v-loads '$"):
        make_config(**load_config_file(path))
    path.write_text('[kvpatch]\n[kvpatch.rules]\n"fp16/256/16" = { "group-v-loads " = "ahead" }\n', encoding="utf-8")
    with pytest.raises(UsageError, match=r"cannot override 'group-v-loads ' \(only "):
        make_config(**load_config_file(path))


@pytest.mark.parametrize(
    "text, message",
    [
        ("lookahead = ", r"^invalid TOML in .*kvpatch\.toml: "),
        ("kvpatch = 3\n", r"^invalid config file .*kvpatch\.toml: \[kvpatch\] must be a table$"),
        # a number written as a string: taken as the number before (the command line's text parsing)
        ('lookahead = "2"\n', r"lookahead = '2': write the number without quotes$"),
        ('size = "4096"\n', r"size = '4096': write the number without quotes \(or \"auto\"\)$"),
        ('[fp16]\nmin-ctas = "8"\n', r"\[fp16\] min-ctas = '8'"),
        ('[rules]\n"fp16/128" = { group = "4" }\n', r"rule 'fp16/128': group = '4'"),
    ],
)
def test_bad_config_files(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "kvpatch.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UsageError, match=message):
        load_config_file(path)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^config file not found: .*nope\.toml$"):
        load_config_file(tmp_path / "nope.toml")
