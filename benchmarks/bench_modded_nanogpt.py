"""modded-nanogpt's published runs predicted: `amem predict` against the peak memory real H100s printed.

    python benchmarks/bench_modded_nanogpt.py REPO RECORD_LOG [RECORD_LOG ...] [--write]

REPO is a checkout of KellerJordan/modded-nanogpt (or its bare git folder: logs are read from HEAD);
each RECORD_LOG is a log under records/ (e.g. records/track_1_short/2024-12-17_SparsifyEmbeds/
165384d5-....txt). Such a log is what the record's run wrote on 8 H100s: its `train_gpt.py` whole
(the script prints its own code first, between two lines of '='), then nvidia-smi, the training
and, at the end, what rank 0's torch measured:
`peak memory allocated: A MiB reserved: R MiB` (`peak memory consumption: A MiB` in older ones).

Each script is predicted unchanged as its record ran it, for the rank that printed its figures:
`amem predict --gpu H100 --rank 0 -- torchrun --standalone --nproc_per_node=8 train_gpt.py`, in a
scratch folder holding the `logs/` folder the repository's runs wrote into and token shards of
random ids in the format its loader reads (magic 20240520, version 1; documents of about a
thousand tokens, each begun by <|endoftext|>, where later loaders align batches; values never
decide memory). Rank 0's figures under the torch policy are compared with the log's, in MiB as
the script printed them (integer division by 1 MiB). The record ran an older torch (the log names
it); the prediction uses this machine's, so inductor's plan may differ where the releases differ.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_predict_programs import amem_commit  # noqa: E402
from results_file import cpu_model, replace_section  # noqa: E402

RESULTS = HERE / "RESULTS.md"
BEGIN = "<!-- BEGIN modded-nanogpt records predicted: written by `python benchmarks/bench_modded_nanogpt.py --write`; do not edit inside -->"
END = "<!-- END modded-nanogpt records predicted -->"
MiB = 1 << 20
RULE = re.compile(r"^={40,}$")
MEASURED = re.compile(r"^peak memory (?:allocated|consumption): (\d+) MiB(?: reserved: (\d+) MiB)?", re.M)
TORCH = re.compile(r"^Running pytorch ([^ ]+)", re.M | re.I)
CARD = re.compile(r"\|\s+0\s+(NVIDIA [^|]+?)\s{2,}")
BOS = 50256   # GPT-2's <|endoftext|>: later records' loaders align batches to it
DOCUMENT_TOKENS = 1000
SHARD_TOKENS = 20_000_000   # the validation loops read 10,485,760 tokens from one pass over the files


def read_log(repo: Path, log: str) -> str:
    if (repo / log).is_file():
        return (repo / log).read_text(errors="replace")
    git_dir = repo / ".git" if (repo / ".git").exists() else repo
    return subprocess.run(["git", "--git-dir", str(git_dir), "show", f"HEAD:{log}"], capture_output=True,
                          text=True, check=True, errors="replace").stdout


def parse(text: str) -> dict:
    """The log's script, what its rank 0 measured, its torch and its card."""
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if RULE.match(line)]
    start = rules[0] + 1 if rules and rules[0] == 0 else 0
    end = next(i for i in rules if i >= start)
    measured = MEASURED.findall(text)
    if not measured:
        raise SystemExit("the log has no 'peak memory ...' line of a finished run")
    allocated, reserved = measured[-1]
    torch_version = TORCH.search(text)
    card = CARD.search(text)
    return {"code": "\n".join(lines[start:end]) + "\n", "allocated_mib": int(allocated),
            "reserved_mib": int(reserved) if reserved else None,
            "torch": torch_version.group(1) if torch_version else "?", "card": card.group(1).strip() if card else "?"}


def prepare(folder: Path) -> None:
    """The folder a record ran in: token shards where its loader looks, and `logs/` (some scripts
    write their log there without making it)."""
    import numpy as np

    (folder / "logs").mkdir(exist_ok=True)
    shards = folder / "data" / "fineweb10B"
    shards.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in ("fineweb_train_000001.bin", "fineweb_val_000000.bin"):
        header = np.zeros(256, dtype=np.int32)
        header[:3] = (20240520, 1, SHARD_TOKENS)
        tokens = rng.integers(0, BOS, SHARD_TOKENS, dtype=np.uint16)
        starts = np.cumsum(rng.integers(DOCUMENT_TOKENS // 4, 2 * DOCUMENT_TOKENS, SHARD_TOKENS // DOCUMENT_TOKENS))
        tokens[starts[starts < SHARD_TOKENS]] = BOS   # documents, each begun by <|endoftext|> as fineweb's are
        tokens[0] = BOS
        with open(shards / name, "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.tobytes())


def predict(code: str, folder: Path, timeout: float) -> dict:
    (folder / "train_gpt.py").write_text(code)
    out = folder / "prediction.json"
    argv = [sys.executable, "-m", "amem_alloc", "predict", "--gpu", "H100", "--rank", "0", "--json", str(out), "--",
            "torchrun", "--standalone", "--nproc_per_node=8", "train_gpt.py"]
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - started
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {done.returncode}: {' | '.join(tail)}", "seconds": seconds}
    rank0 = next(r for r in json.loads(out.read_text())["ranks"] if r["rank"] == 0)
    torch_policy = next(p for p in rank0["policies"] if p["policy"] == "torch")
    return {"allocated": torch_policy["peak_allocated"], "reserved": torch_policy["peak_reserved"],
            "seconds": seconds, "notes": len(rank0["notes"])}


def error(predicted_bytes: int, measured_mib: int | None) -> str:
    if measured_mib is None:
        return "-"
    return f"{100 * (predicted_bytes // MiB - measured_mib) / measured_mib:+.2f}%"


def row(log: str, record: dict, got: dict) -> str:
    name = log.split("/")[-2] if "/" in log else log
    measured = f"{record['allocated_mib']:,}"
    reserved = f"{record['reserved_mib']:,}" if record["reserved_mib"] else "not printed"
    if "error" in got:
        return f"| {name} | {record['torch']} | {measured} | - | - | {reserved} | - | - | {got['error']} |"
    return (f"| {name} | {record['torch']} | {measured} | {got['allocated'] // MiB:,} | "
            f"{error(got['allocated'], record['allocated_mib'])} | {reserved} | {got['reserved'] // MiB:,} | "
            f"{error(got['reserved'], record['reserved_mib'])} | {got['seconds']:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--write", action="store_true", help="write the section of benchmarks/RESULTS.md")
    args = parser.parse_args()
    header = ("| record | its torch | peak allocated MiB, real | predicted | error | peak reserved MiB, real | "
              "predicted | error | prediction wall |\n|---|---|---|---|---|---|---|---|---|")
    rows, cards = [], set()
    for log in args.logs:
        record = parse(read_log(args.repo, log))
        cards.add(record["card"])
        with tempfile.TemporaryDirectory(prefix="amem-modded-nanogpt-") as scratch:
            prepare(Path(scratch))
            got = predict(record["code"], Path(scratch), args.timeout)
        rows.append(row(log, record, got))
        print(rows[-1], flush=True)
    import torch

    section = (f"## modded-nanogpt records predicted (real H100 runs)\n\n"
               f"Each record's `train_gpt.py`, taken whole from its published log in KellerJordan/modded-nanogpt, "
               f"predicted unchanged with `amem predict --gpu H100 --rank 0 -- torchrun --standalone "
               f"--nproc_per_node=8 train_gpt.py` (torch policy; random token shards) against what the record's rank 0 printed "
               f"on its {', '.join(sorted(cards))} (`torch.cuda.max_memory_allocated()` / `max_memory_reserved()`, "
               f"MiB). Measured by benchmarks/bench_modded_nanogpt.py on {cpu_model()} (no GPU), torch "
               f"{torch.__version__}, amem at {amem_commit()}, {time.strftime('%Y-%m-%d')}. The records ran the "
               f"torch their logs name.\n\n{header}\n" + "\n".join(rows) + "\n\nLogs:\n\n" +
               "\n".join(f"* `{log}`" for log in args.logs) + "\n")
    print(section)
    if args.write:
        replace_section(RESULTS, BEGIN, END, section)


if __name__ == "__main__":
    main()
