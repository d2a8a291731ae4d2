"""Run 8 probe: which ALiBi inputs expose a kernel that vLLM's test found differing (bf16 head 128 block 16 v1,
inline issue) but kvpatch's validation passed? Libraries from argv: NAME=PATH:PREFIX ... (stock first)."""
import json, random, sys, time
from kvpatch.gpu import inputs as I
from kvpatch.gpu import launch as L
from kvpatch.gpu import validate as V

libs = {}
for a in sys.argv[2:]:
    name, rest = a.split("=", 1); path, prefix = rest.rsplit(":", 1); libs[name] = L.Kernels(path, prefix)
model = I.random_alibi_slopes
def randn(n, rng):
    return [rng.gauss(0.0, 1.0) for _ in range(n)]
out = []
for slopes in ("model", "randn"):
    I.random_alibi_slopes = model if slopes == "model" else randn
    for hs in (128, 64):
        for ctx in (1500, 4096, 16000, 40000):
            for heads in ((32, 8), (40, 40), (64, 8)):
                for k in ("v1", "v2"):
                    for nseq in (8,):
                        case = V.ValidateCase("bf16", "auto", hs, 16, k, *heads, True, ctx, nseq)
                        if case.config not in libs["stock"].configs:
                            continue
                        t0 = time.time()
                        rep = V.run_validate({n: l for n, l in libs.items() if case.config in l.configs}, [case], seed=0)
                        r = rep.results[0]
                        row = {"slopes": slopes, "case": case.name, "nseq": nseq, "status": r.status, "reasons": r.reasons,
                               "variants": {n: {"status": v.status, "mismatched": v.mismatched} for n, v in r.variants.items()},
                               "s": round(time.time() - t0, 2)}
                        out.append(row)
                        print(json.dumps(row), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
