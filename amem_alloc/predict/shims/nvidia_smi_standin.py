"""The `nvidia-smi` a predicted script runs on a machine with none: the predicted cards, idle.

Run as a program (`python -I -S nvidia_smi_standin.py ARGS`, by the folder nvidia_smi.py puts
first on PATH), never imported by amem: it needs nothing but the standard library, so it starts in
a few milliseconds. The cards come in $AMEM_NVIDIA_SMI_CARDS (JSON: name, total MiB, capability,
count). It answers what scripts ask of nvidia-smi: the default table (logged by training scripts),
`-L`, `--query-gpu=... --format=csv[,noheader][,nounits]` (to pick a free card) and
`--query-compute-apps=...` (no processes), with `-i` choosing cards. Every card is idle: nothing
used, all of its memory free (torch's total, which leaves out what the driver keeps). The driver's
version, temperatures and power are unknown here and given as nvidia-smi gives an unsupported
field, "[N/A]". Anything else gets one line on stderr and exit status 0 (a script that only logs
the output goes on).
"""
import json
import os
import sys
import time

NA = "[N/A]"
WIDTH = 89


def cards() -> list:
    given = json.loads(os.environ.get("AMEM_NVIDIA_SMI_CARDS") or "{}")
    count = int(given.get("count", 1))
    return [dict(index=i, name=given.get("name", "GPU"), total=int(given.get("total_mib", 0)),
                 capability=given.get("capability", NA)) for i in range(count)]


def field(card: dict, name: str, count: int):
    """(value, unit) of one --query-gpu field; None where nvidia-smi knows no such field."""
    mib = "MiB"
    fields = {
        "index": (card["index"], ""), "count": (count, ""),
        "name": (card["name"], ""), "gpu_name": (card["name"], ""),
        "uuid": (uuid(card), ""), "gpu_uuid": (uuid(card), ""),
        "pci.bus_id": (bus_id(card), ""), "gpu_bus_id": (bus_id(card), ""),
        "memory.total": (card["total"], mib), "memory.used": (0, mib), "memory.free": (card["total"], mib),
        "memory.reserved": (0, mib),
        "utilization.gpu": (0, "%"), "utilization.memory": (0, "%"),
        "compute_cap": (card["capability"], ""), "persistence_mode": ("Disabled", ""),
        "compute_mode": ("Default", ""), "mig.mode.current": ("Disabled", ""),
        "driver_version": (NA, ""), "vbios_version": (NA, ""), "serial": (NA, ""),
        "temperature.gpu": (NA, ""), "fan.speed": (NA, ""), "pstate": (NA, ""),
        "power.draw": (NA, ""), "power.limit": (NA, ""), "clocks.sm": (NA, ""), "clocks.mem": (NA, ""),
    }
    return fields.get(name)


def uuid(card: dict) -> str:
    return f"GPU-00000000-0000-0000-0000-{card['index']:012d}"


def bus_id(card: dict) -> str:
    return f"00000000:{card['index'] + 1:02X}:00.0"


def option(args: list, *names: str):
    """The value of `--name=value`, `--name value` or `-n value`; None where absent."""
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return None


def chosen(all_cards: list, args: list) -> list:
    ids = option(args, "-i", "--id")
    if ids is None:
        return all_cards
    wanted = {int(i) for i in ids.split(",") if i.strip().isdigit()}
    return [c for c in all_cards if c["index"] in wanted]


def query_gpu(all_cards: list, args: list, names: str) -> int:
    form = (option(args, "--format") or "").split(",")
    if "csv" not in form:
        print('"--format" must be given with --query-gpu: try --format=csv', file=sys.stderr)
        return 2
    names = [n.strip() for n in names.split(",") if n.strip()]
    sample = all_cards[0] if all_cards else dict(index=0, name="GPU", total=0, capability=NA)
    for name in names:
        if field(sample, name.lower(), len(all_cards)) is None:
            print(f'Field "{name}" is not a valid field to query.\n', file=sys.stderr)
            return 2
    rows = []
    if "noheader" not in form:
        units = [field(sample, n.lower(), 1)[1] for n in names]
        rows.append(", ".join(n + (f" [{u}]" if u and "nounits" not in form else "") for n, u in zip(names, units)))
    for card in chosen(all_cards, args):
        values = [field(card, n.lower(), len(all_cards)) for n in names]
        rows.append(", ".join(f"{v}" if not u or "nounits" in form or v == NA else f"{v} {u}" for v, u in values))
    print("\n".join(rows))
    return 0


def query_apps(args: list, names: str) -> int:
    form = (option(args, "--format") or "").split(",")
    if "noheader" not in form:
        print(", ".join(n.strip() for n in names.split(",") if n.strip()))
    return 0


def table(all_cards: list, args: list) -> int:
    line = "+" + "-" * (WIDTH - 2) + "+"
    rows = [time.strftime("%a %b %d %H:%M:%S %Y"), line,
            _boxed("NVIDIA-SMI stand-in (amem predict: no GPU here; the predicted cards, idle)"), line]
    for card in chosen(all_cards, args):
        memory = f"0MiB / {card['total']}MiB"
        rows += [_boxed(f"{card['index']:>3}  {card['name'][:32]:<32}  {memory:>22}   0%  Default"),
                 line]
    rows += ["", line, _boxed("Processes:"), _boxed("No running processes found"), line]
    print("\n".join(rows))
    return 0


def _boxed(text: str) -> str:
    return "| " + text[:WIDTH - 4].ljust(WIDTH - 4) + " |"


def without_ids(args: list) -> list:
    """The arguments less the cards chosen (-i N, --id N, --id=N)."""
    out, skip = [], False
    for arg in args:
        if skip or arg.startswith("--id="):
            skip = False
            continue
        skip = arg in ("-i", "--id")
        if not skip:
            out.append(arg)
    return out


def main(args: list) -> int:
    all_cards = cards()
    names = option(args, "--query-gpu")
    if names is not None:
        return query_gpu(all_cards, args, names)
    names = option(args, "--query-compute-apps")
    if names is not None:
        return query_apps(args, names)
    if "-L" in args or "--list-gpus" in args:
        print("\n".join(f"GPU {c['index']}: {c['name']} (UUID: {uuid(c)})" for c in chosen(all_cards, args)))
        return 0
    if not without_ids(args):
        return table(all_cards, args)
    print(f"amem predict: its stand-in for nvidia-smi answers the table, -L, --query-gpu and "
          f"--query-compute-apps; not `nvidia-smi {' '.join(args)}` (no GPU here)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
