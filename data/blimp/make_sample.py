"""Rebuild data/blimp/: the first 50 minimal pairs of each of BLiMP's 67 paradigms (see SOURCE.md), and
configs/lm-eval/blimp-sample.yaml, the lm-evaluation-harness group that reads them.

    python data/blimp/make_sample.py [/path/to/blimp]   # default: ../shared/data/blimp beside the repository

Each `<paradigm>.jsonl.gz` holds the first 50 lines of BLiMP's `data/<paradigm>.jsonl`, unchanged, gzipped at
level 9 with no name or timestamp, so the files are the same bytes on every rebuild.
"""

import gzip
import io
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SOURCE = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[2] / "shared" / "data" / "blimp"
PAIRS = 50


def first_lines(path: Path, n: int) -> bytes:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        return b"".join(line for _, line in zip(range(n), f))


def main() -> None:
    files = sorted((SOURCE / "data").glob("*.jsonl*"))
    if not files:
        sys.exit(f"error: no BLiMP files in {SOURCE}/data; pass the folder that holds BLiMP's data/")
    for path in files:
        name = path.name.removesuffix(".gz")
        buffer = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as out:
            out.write(first_lines(path, PAIRS))
        (HERE / f"{name}.gz").write_bytes(buffer.getvalue())
    sys.path.insert(0, str(REPO))
    from pretrain.zero_shot.blimp import LM_EVAL_HEADER, PARADIGMS, lm_eval_group

    group = lm_eval_group({name: f"data/blimp/{name}.jsonl.gz" for name in PARADIGMS}, "kiln_blimp_sample", LM_EVAL_HEADER)
    (REPO / "configs" / "lm-eval" / "blimp-sample.yaml").write_text(group)
    print(f"wrote {len(files)} files to {HERE} and configs/lm-eval/blimp-sample.yaml")


if __name__ == "__main__":
    main()
