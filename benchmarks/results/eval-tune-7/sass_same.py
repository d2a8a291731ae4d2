"""Which kernels of a patched build have SASS that differs from stock's (namespace and offsets aside).

    python sass_same.py STOCK/kernels.sass.gz PATCHED/kernels.sass.gz kvpatch_stock kvpatch_patched
(the kernels.sass.gz files are in the build directories that build.json names)."""
import gzip
import re
import subprocess
import sys


def functions(path, prefix):
    text = gzip.open(path, "rt").read().replace(f"{len(prefix)}{prefix}", "NS").replace(prefix, "NS")
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
        elif cur:
            out[cur].append(re.sub(r"/\*[0-9a-f]{4}\*/", "", line).strip())
    return out


s, p = functions(sys.argv[1], sys.argv[3]), functions(sys.argv[2], sys.argv[4])
differ = [k for k in s if k in p and s[k] != p[k]]
print(f"{len(s)} stock kernels, {len(p)} patched; identical {sum(k in p and s[k] == p[k] for k in s)}, differ {len(differ)}, "
      f"missing {sum(k not in p for k in s)}")
for k in differ:
    print("differs:", subprocess.run(["c++filt", k.replace("NS", "2ns")], capture_output=True, text=True).stdout.strip())
