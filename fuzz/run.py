#!/usr/bin/env python3
"""`make fuzz`: build the fuzz targets once, run each for FUZZ_SECONDS, write target/fuzz/report.json.

Stable toolchain: `cargo fuzz build/run -s none` (no sanitizer) needs no nightly feature;
nothing here sets RUSTC_BOOTSTRAP.

Seeds are generated at run time into target/fuzz-corpus/<target>/ from the repository's own
fixtures (cloudstack-fixtures/, the scenario files) and, when present, read in place from
../shared (upstream recordings, signing vectors): nothing fetched is ever copied into the
repository. The corpus directory keeps what libFuzzer finds between runs (target/ is ignored).
Exit status 1 when a target crashes (the input is kept in target/fuzz/artifacts/<target>/).
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
TARGETS = ["cloudstack_parse", "error_envelope", "signing_encoder", "sim_scenario", "condition_upsert"]
BUILD_DIR = ROOT / "target" / "fuzz-build"
OUT = ROOT / "target" / "fuzz"
CORPUS = ROOT / "target" / "fuzz-corpus"

# The HTTP status each wire fixture is served with (cloudstack-fixtures/wire/README.md), as the
# index into props::STATUSES (0 = 200).
STATUS_INDEX = {200: 0, 401: 6, 429: 8, 431: 9, 432: 10, 502: 12, 530: 14}


def fixture_status(name):
    m = re.match(r"(?:error|proxy)-(\d{3})", name)
    return int(m.group(1)) if m else 200


def write_seed(target, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / ("seed-" + hashlib.sha1(data).hexdigest())).write_bytes(data)


def upstream_bodies():
    """The recorded response bodies of ../shared/cloudstack-upstream-fixtures, read in place."""
    d = SHARED / "cloudstack-upstream-fixtures"
    if not d.is_dir():
        return []
    out = []
    for f in sorted(d.glob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            out.extend(json.dumps(body).encode() for body in doc.values())
    return out


def make_seeds():
    wire = sorted((ROOT / "cloudstack-fixtures" / "wire").glob("*"))
    for f in wire:
        if f.suffix not in (".json", ".html"):
            continue
        body = f.read_bytes()
        status = STATUS_INDEX.get(fixture_status(f.name), 0)
        ct = 3 if f.suffix == ".html" else 0
        # parser: [mode < 0xC0, status, content type, body]; error target: [mode 0, status, body]
        write_seed("cloudstack_parse", bytes([0, status, ct]) + body)
        write_seed("cloudstack_parse", bytes([0, 0, ct]) + body)
        write_seed("error_envelope", bytes([0, status]) + body)
    for body in upstream_bodies():
        write_seed("cloudstack_parse", bytes([0, 0, 0]) + body)
        write_seed("error_envelope", bytes([0, 0]) + body)
    # generated pages and envelopes (the round-trip modes), from a few byte patterns
    for i in range(8):
        write_seed("cloudstack_parse", bytes([0xC0 + i]) + bytes(range(i, 64 + i)))
        write_seed("error_envelope", bytes([1]) + bytes(range(i, 48 + i)))
        write_seed("error_envelope", bytes([2]) + bytes(range(i, 48 + i)))
        write_seed("condition_upsert", bytes(range(i, 48 + i)))

    vectors = SHARED / "cloudstack-signing-vectors.json"
    if vectors.is_file():
        doc = json.loads(vectors.read_text())
        for v in doc.get("vectors", []):
            parts = [doc.get("secret_key", "").encode()]
            parts += [f"{k}={val}".encode() for k, val in v.get("params", {}).items()]
            write_seed("signing_encoder", b"\xff".join(parts))
    write_seed("signing_encoder", b"secret\xffcommand=listVirtualMachines\xffresponse=json\xffname=a b~c*d")

    for f in sorted((ROOT / "cloudstack-fixtures" / "scenarios").glob("*.json")):
        # `count` at most 20: a 20 000-VM seed would make every execution a big world
        doc = json.loads(f.read_text())
        for vm in doc.get("vms", []):
            if isinstance(vm, dict) and isinstance(vm.get("count"), int):
                vm["count"] = min(vm["count"], 20)
        write_seed("sim_scenario", json.dumps(doc, indent=1).encode())
    write_seed("sim_scenario", b"{}")


def cargo_fuzz(*args):
    return ["nice", "-n", "19", "cargo", "fuzz", *args]


def parse_stats(log):
    """Executions and seconds from libFuzzer's final lines."""
    execs = None
    m = re.findall(r"stat::number_of_executed_units:\s*(\d+)", log)
    if m:
        execs = int(m[-1])
    secs = None
    d = re.findall(r"Done (\d+) runs in (\d+) second", log)
    if d:
        execs = execs if execs is not None else int(d[-1][0])
        secs = int(d[-1][1])
    if execs is None:
        # a crash ends the run before the final stats: take the last status line
        s = re.findall(r"#(\d+)\s+(?:INITED|NEW|REDUCE|pulse|DONE|RELOAD)", log)
        if s:
            execs = int(s[-1])
    return execs, secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_SECONDS", "20")))
    ap.add_argument("--targets", default=",".join(TARGETS))
    args = ap.parse_args()
    targets = [t for t in args.targets.split(",") if t]
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    make_seeds()
    t0 = time.monotonic()
    build = subprocess.run(
        cargo_fuzz("build", "-s", "none", "--target-dir", str(BUILD_DIR)), cwd=ROOT
    )
    build_seconds = round(time.monotonic() - t0, 1)
    if build.returncode != 0:
        print("fuzz: build failed", file=sys.stderr)
        return 2

    rows = []
    for t in targets:
        artifacts = OUT / "artifacts" / t
        artifacts.mkdir(parents=True, exist_ok=True)
        before = set(artifacts.iterdir())
        cmd = cargo_fuzz(
            "run", "-s", "none", "--target-dir", str(BUILD_DIR), t, str(CORPUS / t), "--",
            f"-max_total_time={args.seconds}",
            f"-dict={ROOT / 'fuzz' / 'dict' / (t + '.dict')}",
            f"-artifact_prefix={artifacts}/",
            "-print_final_stats=1",
            "-timeout=30",
            "-rss_limit_mb=2048",
        )
        t0 = time.monotonic()
        run = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        seconds = round(time.monotonic() - t0, 1)
        (OUT / f"{t}.log").write_text(run.stdout)
        execs, fuzz_seconds = parse_stats(run.stdout)
        new = sorted(str(p.relative_to(ROOT)) for p in set(artifacts.iterdir()) - before)
        crashed = run.returncode != 0
        rows.append({
            "target": t,
            "executions": execs,
            "fuzz_seconds": fuzz_seconds,
            "wall_seconds": seconds,
            "crashes": max(len(new), 1) if crashed else 0,
            "artifacts": new,
            "exit_code": run.returncode,
            "corpus_units": len(list((CORPUS / t).iterdir())),
        })
        state = f"CRASH ({', '.join(new) or 'see log'})" if crashed else "ok"
        print(f"fuzz: {t}: {execs} executions in {fuzz_seconds} s: {state}", flush=True)
        if crashed:
            tail = "\n".join(run.stdout.splitlines()[-40:])
            print(tail, file=sys.stderr)

    report = {
        "fuzz_seconds_per_target": args.seconds,
        "build_seconds": build_seconds,
        "total_seconds": round(time.monotonic() - started, 1),
        "sanitizer": "none (stable toolchain, no RUSTC_BOOTSTRAP)",
        "targets": rows,
    }
    (OUT / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"fuzz: wrote {(OUT / 'report.json').relative_to(ROOT)}")
    return 1 if any(r["crashes"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
