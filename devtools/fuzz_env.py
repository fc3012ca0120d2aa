"""Fuzz target for the environment variables of the README's configuration table.

Each case sets one variable to a generated value and runs a fresh interpreter (the runtime
reads its configuration once per process) that uses what the variable configures: a tensor
on the device, the compile cache's directory and lock timeout, the process-group transport
(TORCHNEURON_INDUCTOR_DEVICE acts at import, which must succeed). The oracle: the child
succeeds (the value is valid, or the variable is documented to take any value), or it
fails with a Python exception whose message names the variable; a crash, a hang (the child
is killed after a timeout), a traceback that does not name the variable, or a value
accepted against the table's rules is a finding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from .fuzz_oracle import Finding
from .fuzz_target import TargetReport, settings_for

CHILD_TIMEOUT_S = 60

VARIABLES = (
    "NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES",
    "NEURON_LAUNCH_BLOCKING", "TORCHNEURON_CHIPS", "TORCHNEURON_HOST_MEMORY_BUDGET",
    "TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT",
    "TORCHNEURON_DIST_TRANSPORT", "TORCHNEURON_INDUCTOR_DEVICE",
)  # fmt: skip

SPECIAL = ("", " ", "0", "1", "2", "-1", "3-1", "0-1,3", "0,0", "0-", "-", ",", "1e3", "nan",
           "inf", "-inf", "0x10", "18446744073709551616", "99999999999999999999999", "8GiB",
           "1KiB", "0B", "1.5GiB", "-8GiB", "1 TiB", "trn1", "trn2", "trn3", "trn9", "TRN2",
           "auto", "shm", "gloo", "mpi", "true", "false", "yes", "/", "relative/dir", "\t1\n",
           "é", "1\u00a0")  # fmt: skip

CHILD = r"""
import json, os, sys
var = sys.argv[1]
try:
    import torch
    x = torch.arange(4.0, device="neuron") * 2
    assert x.sum().item() == 12.0
    count = torch.neuron.device_count()
    from torchneuron.compile import neff_cache
    neff_cache.NeffCache().check_root()
    timeout = neff_cache.lock_timeout()
    from torchneuron.distributed import process_group as distributed
    store = torch.distributed.HashStore()
    distributed._exchange_identities(store, 0, 1)
    print("ACCEPTED " + json.dumps({"devices": count, "lock_timeout": repr(timeout)}))
except Exception as error:
    print("REFUSED " + json.dumps({"type": type(error).__name__, "message": str(error)}))
    sys.exit(3)
"""


def env_cases() -> st.SearchStrategy[tuple[str, str]]:
    printable = st.text(
        alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12
    )
    return st.tuples(st.sampled_from(VARIABLES), st.one_of(st.sampled_from(SPECIAL), printable))


def _refusal_required(var: str, value: str, accepted: dict[str, Any]) -> str | None:
    """Why an accepted value breaks the table's rules, or None."""
    if var == "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT":
        seconds = accepted["lock_timeout"]
        if seconds == "nan":
            return f"lock timeout {value!r} was read as NaN seconds"
    if var == "TORCHNEURON_DIST_TRANSPORT" and value not in ("auto", "shm", "gloo"):
        return "the transport must be auto, shm or gloo"
    return None


def run_case(var: str, value: str, workdir: str) -> tuple[str, str]:
    """(outcome, detail) of one child run; raises Finding on a defect."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env[var] = value
    try:
        done = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", CHILD, var], env=env, cwd=workdir,
            capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise Finding(f"{var}={value!r}: the process hung ({CHILD_TIMEOUT_S} s)") from None
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode == 0 and last.startswith("ACCEPTED "):
        why = _refusal_required(var, value, json.loads(last[len("ACCEPTED ") :]))
        if why:
            raise Finding(f"{var}={value!r} accepted, but {why}")
        return "accepted", ""
    if done.returncode == 3 and last.startswith("REFUSED "):
        refusal = json.loads(last[len("REFUSED ") :])
        if var not in refusal["message"]:
            raise Finding(
                f"{var}={value!r} refused with a message that does not name the variable: "
                f"{refusal['type']}: {refusal['message'][:300]}"
            )
        return "refused", refusal["type"]
    tail = "\n".join(done.stderr.strip().splitlines()[-8:])
    raise Finding(f"{var}={value!r}: exit {done.returncode}, no clear error\n{tail}")


def run_environment(examples: int, verbose: bool) -> Any:
    report = TargetReport("environment variables")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchneuron-fuzz-env-") as workdir:
        os.chmod(workdir, 0o700)

        @settings_for(examples)
        @given(env_cases())
        def property_(case: tuple[str, str]) -> None:
            report.cases += 1
            outcome = run_case(*case, workdir)
            if verbose:
                print(f"{case!r}: {outcome}", flush=True)

        try:
            property_()
        except Exception as error:  # noqa: BLE001 - the finding, shrunk by hypothesis
            report.findings.append(f"{type(error).__name__}: {error}"[:2000])
    report.seconds = time.monotonic() - started
    return report
