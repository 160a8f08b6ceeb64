"""Feature rows of the MWOZ + SGD cases (all splits), cached under /tmp for the experiments here.

python bench/results/i60/cache.py /tmp/uss [/tmp/i60-features.npz]
Every ±1 case, and 1 in 5 of the neutral ones (by case id), so that "neutral signed" can be measured.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import numpy as np

from judge.embedding import features
from judge.eval.dataset import LABEL_SCORE
from judge.eval.uss import FIT_SOURCES, dialogue_cases, read_dialogues, source_file


def main() -> None:
    directory = Path(sys.argv[1])
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/i60-features.npz")
    rows = []
    for source in FIT_SOURCES:
        path = source_file(directory, source)
        assert path is not None, source
        for d in read_dialogues(path, source):
            for c in dialogue_cases(d, d.split):
                keep = c.label != "neutral" or int(hashlib.sha256(c.id.encode()).hexdigest(), 16) % 5 == 0
                if keep:
                    rows.append((source, d.split, c))
    t0 = time.perf_counter()
    x = features([c.inp for _, _, c in rows])
    print(f"{len(rows)} cases in {time.perf_counter() - t0:.0f}s")
    np.savez(out, x=x, y=np.array([LABEL_SCORE[c.label] for _, _, c in rows]),
             source=np.array([s for s, _, _ in rows]), split=np.array([sp for _, sp, _ in rows]),
             id=np.array([c.id for _, _, c in rows]))


if __name__ == "__main__":
    main()
