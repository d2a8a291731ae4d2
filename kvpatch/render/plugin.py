"""What ``kvpatch plugin enable|status|check`` print (plain lines: they are read in logs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..commands.plugin import EnableReport
    from ..gpu.plugin_check import CheckReport
    from ..vllm_plugin import Decision

#: What a bundle's configurations are (vLLM's full set: 243 of them in 0.10.2).
CONFIGURATIONS = "configurations (dtype x KV-cache dtype x head size x block size, each its v1 and v2 kernels)"


def enable_lines(report: EnableReport) -> list[str]:
    m = report.manifest
    built = "from kvpatch's build cache" if report.cached else "built"
    lines = [
        f"installed kvpatch's patched kernels for vLLM {m.vllm_release} in {report.directory}",
        f"  configuration: {m.marker}",
        f"  library: {m.library} ({m.library_bytes / 2**20:.1f} MiB, {len(m.configs)} {CONFIGURATIONS}, "
        f"{', '.join(m.archs)}; {built}: {report.library})",
    ]
    if report.installed_vllm is not None:
        lines.append(f"  vLLM {report.installed_vllm} in this environment loads them through its plugin entry point "
                     "(vllm.general_plugins: kvpatch)")  # fmt: skip
    lines.append("  vLLM calls them on CUDA with VLLM_USE_V1=0 VLLM_ATTENTION_BACKEND=XFORMERS; "
                 "KVPATCH_DISABLE=1 keeps vLLM's own; 'kvpatch plugin check' compares them on this GPU")  # fmt: skip
    return lines


def status_lines(decision: Decision) -> list[str]:
    d = decision
    lines = [d.line(), f"  bundle: {d.bundle}"]
    if d.action == "off" and d.fix:
        lines.append(f"  to enable: {d.fix}")
    if d.release:
        lines.append(f"  built for vLLM {d.release} (stock header {d.header_revision}), {d.configs} {CONFIGURATIONS}, "
                     f"{', '.join(d.archs)}")  # fmt: skip
    if d.vllm_version:
        lines.append(f"  installed: vLLM {d.vllm_version}, torch {d.torch_version}")
    if d.unserved:
        lines.append(f"  a call the library cannot serve: {d.unserved}")
    lines += [f"  {g}" for g in d.gpus]
    lines += [f"  note: {n}" for n in d.notes]
    return lines


def check_lines(report: CheckReport) -> list[str]:
    lines = list(report.summary())
    if report.timings:
        lines.append("(kernel times, CUDA-graph replays, median: not a serving measurement)")
    return lines
