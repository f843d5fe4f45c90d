#!/usr/bin/env python3
"""Write tests/fixtures/h2o-score.json: H2O scores of the opt-pre fixture
model from the independent PyTorch reference (bench/h2o_ref.py), for
tests/test_h2o.c.

One block of lines whose prompts range from 1 to 16 tokens, scored under
budgets set by ratios as `sluice score --hh-ratio H --recent-ratio R` sets
them: floor(H * P) heavy and floor(R * P) recent tokens for a prompt of P,
so the short prompts have a budget of 0 (each decode step attends to its
own token alone) while the longer ones evict.  The reference scores each
prompt shape on its own (bench/h2o_ref.py groups by shape), so a line's
reference does not depend on what it is batched with.

usage: tools/make_h2o_score_fixture.py [FIXTURES_DIR]   (needs torch)
"""
import json
import math
import os
import random
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "bench"))
import h2o_ref  # noqa: E402

CASES = [(0.2, 0.2), (0.1, 0.1), (0.0, 0.3), (0.3, 0.0), (0.0, 0.0)]


def main():
    fx = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "fixtures")
    m = h2o_ref.OPT(os.path.join(fx, "opt-pre"))
    rnd = random.Random(11)
    lines = []
    for plen, clen in [(3, 6), (12, 5), (1, 4), (16, 7), (7, 2), (4, 6), (10, 1), (2, 5)]:
        lines.append({"input_ids": [2] + [rnd.randint(3, 511) for _ in range(plen - 1)],
                      "continuation_ids": [rnd.randint(3, 511) for _ in range(clen)]})
    cases = []
    for hh, rr in CASES:
        lps = []
        for ln in lines:
            P = len(ln["input_ids"])
            H, R = math.floor(hh * P), math.floor(rr * P)
            lps.append(h2o_ref.run(m, [ln["input_ids"]], [ln["continuation_ids"]], "h2o", H, R)[0])
        cases.append({"hh_ratio": hh, "recent_ratio": rr, "logprobs": lps})
    out = {"model": "opt-pre", "reference": "bench/h2o_ref.py (fp32)", "lines": lines,
           "cases": cases}
    with open(os.path.join(fx, "h2o-score.json"), "w") as f:  # a line per list
        f.write("{\"model\": %s, \"reference\": %s,\n \"lines\": [\n  " %
                (json.dumps(out["model"]), json.dumps(out["reference"])))
        f.write(",\n  ".join(json.dumps(ln) for ln in lines))
        f.write("],\n \"cases\": [\n")
        f.write(",\n".join(
            "  {\"hh_ratio\": %r, \"recent_ratio\": %r, \"logprobs\": [\n   %s]}" %
            (c["hh_ratio"], c["recent_ratio"], ",\n   ".join(json.dumps(lp) for lp in c["logprobs"]))
            for c in cases))
        f.write("]}\n")


if __name__ == "__main__":
    main()
