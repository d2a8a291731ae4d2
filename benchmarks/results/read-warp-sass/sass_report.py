"""The SASS of read=lane vs read=warp candidates (fp16 head 128 block 16): see README.md beside the output."""
import collections, gzip, json, os, re, sys


def functions(path):
    out, cur = {}, None
    for line in gzip.open(path, "rt"):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
        elif cur and re.search(r"/\*[0-9a-f]{4}\*/", line):
            out[cur].append(re.sub(r"^\s*/\*[0-9a-f]{4}\*/\s*", "", line).split(";")[0].strip())
    return out


def opcode(ins):
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split(" ")[0].split(".")[0]


def key_loop(v):
    """(first, last) index of the innermost backward branch's range holding the first prefetch."""
    pf = [i for i, l in enumerate(v) if "UBLKPF" in l or l.startswith("CALL") or " CALL" in l]
    loops = []
    for i, l in enumerate(v):
        m = re.search(r"BRA(?:\.\w+)* 0x([0-9a-f]+)", l)
        if m and int(m.group(1), 16) // 16 < i:
            loops.append((int(m.group(1), 16) // 16, i))
    return next(((a, b) for a, b in sorted(loops, key=lambda x: x[1] - x[0]) if pf and a <= pf[0] <= b and b - a > 100), None)


KEYS = ["BRA", "BSSY", "BSYNC", "LDG", "MUFU", "I2F", "F2I", "CALL", "UBLKPF", "VOTEU", "HFMA2", "FFMA"]
libs = [l.split() for l in open(sys.argv[1]) if re.match(r"^(stock|call_|inline_|split_)\S* /", l)]
stock = {}
for name, lib in libs:
    d = os.path.dirname(lib)
    regs = {r["kernel"]: r["registers"] for r in json.load(open(os.path.join(d, "result.json")))["kernels"]}
    for fn, v in sorted(functions(os.path.join(d, "kernels.sass.gz")).items()):
        kern = "v1" if "paged_attention_v1_kernel" in fn else "v2" if "paged_attention_v2_kernel" in fn else None
        if kern is None:
            continue
        c = collections.Counter(map(opcode, v))
        stock.setdefault(kern, c) if name == "stock" else None
        loop = key_loop(v)
        divide = bool(loop) and any("MUFU.RCP" in v[i] for i in range(loop[0], loop[1] + 1))
        bssy = sum("BSSY" in v[i] for i in range(loop[0], loop[1] + 1)) if loop else 0
        ldg = [i for i in range(loop[0], loop[1] + 1) if "LDG.E.CONSTANT" in v[i]] if loop else []
        gap = ldg[1] - ldg[0] if len(ldg) >= 2 else "-"
        diff = " ".join(f"{k}:{c[k] - stock[kern][k]:+d}" for k in KEYS if c[k] != stock[kern][k])
        print(f"{name:25s} {kern}  instrs {len(v):5d}  regs {regs[kern]:4d}  key loop {str(loop):12s} "
              f"divide in it {'yes' if divide else 'no ':3s}  BSSY in it {bssy}  block-table LDGs {gap!s:>3} apart  {diff}")
