"""torch.distributed across two hosts, for real: network namespaces joined by a veth pair.

Each "host" is a network namespace with an address of its own (10.231.0.1 and .2/24, visible
only inside the two namespaces) and a UTS namespace with its own host name (node0, node1),
resolved through /etc/netns/<ns>/hosts as DNS would on a cluster. Both share this kernel,
/dev/shm and boot id; what tells them apart is the host name, as between real hosts. One
`torchrun --nnodes 2 --nproc-per-node 2` runs per namespace with a static rendezvous on
node0's address. The ranks (tests/support/multihost_rank.py) write what they saw to JSON; the tests
below compare it with closed forms, a one-device reference, and the time the link went down.

The job runs once per module (about 30-60 s on a loaded two-core machine; the /dev/shm case
at the end takes ~12 s). Where namespaces cannot be made (no CAP_NET_ADMIN/CAP_SYS_ADMIN, no
`ip` or `unshare`) it is skipped for an unprivileged user and fails as root (CI runs as root:
tests/support/privileges.py). Namespaces, links and
/etc/netns entries are removed whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import clean_env
from support.privileges import cannot_run
from test_distributed import TOL, _single_device_reference

LINK_TIMEOUT_S = 10  # the timeout of the group the ranks loop on when the link goes down
SLACK_S = 5  # scheduling delay allowed on top of it (a loaded two-core machine)
START_DEADLINE_S = 240  # until every rank is looping, on a loaded machine
HOSTS = ("node0", "node1")
ADDRESSES = ("10.231.0.1", "10.231.0.2")
PREFIX = "tnmh"  # namespaces and links are tnmh<pid><i>: ours, and within IFNAMSIZ
ETC_NETNS = Path("/etc/netns")


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _check(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise OSError(f"{' '.join(done.args)}: {done.stderr.strip() or done.returncode}")


class TwoHosts:
    """Two network namespaces joined by a veth pair, each with its own name and address."""

    def __init__(self) -> None:
        self.names = [f"{PREFIX}{os.getpid()}{i}" for i in range(2)]  # namespace = link name
        self.made_etc_netns = not ETC_NETNS.exists()

    def create(self) -> None:
        """Builds both hosts; raises OSError with the failing command's message."""
        _remove_stale()
        for ns in self.names:
            _check(_ip("netns", "add", ns))
        a, b = self.names
        _check(_ip("link", "add", a, "netns", a, "type", "veth", "peer", "name", b, "netns", b))
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{addr} {host}\n" for addr, host in zip(ADDRESSES, HOSTS, strict=True)
        )
        for ns, addr in zip(self.names, ADDRESSES, strict=True):
            _check(_ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ns))
            _check(_ip("-n", ns, "link", "set", ns, "up"))
            _check(_ip("-n", ns, "link", "set", "lo", "up"))
            etc = ETC_NETNS / ns  # `ip netns exec` mounts its files over /etc's
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
        # a UTS namespace and a host name of its own: the identity the backend compares
        probe = _ip("netns", "exec", a, "unshare", "--uts", "sh", "-c", _SET_HOSTNAME, "probe")
        _check(probe)

    def start(self, i: int, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        """Runs argv on host i, under host i's name."""
        command = ["ip", "netns", "exec", self.names[i], "unshare", "--uts"]
        command += ["sh", "-c", _SET_HOSTNAME + ' && exec "$@"', HOSTS[i], *argv]
        with log.open("w") as out:
            return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)

    def link_down(self) -> None:
        _check(_ip("-n", self.names[0], "link", "set", self.names[0], "down"))

    def stop(self) -> None:
        """Kills what runs in the namespaces (only processes this test started)."""
        for ns in self.names:
            _kill_namespace_processes(ns)

    def remove(self) -> None:
        for ns in self.names:
            _kill_namespace_processes(ns)
            _ip("netns", "del", ns)  # takes the veth pair with it
            shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
        if self.made_etc_netns:
            try:
                ETC_NETNS.rmdir()
            except OSError:
                pass  # another run's entries are in it


_SET_HOSTNAME = 'echo "$0" > /proc/sys/kernel/hostname'


def _kill_namespace_processes(ns: str) -> None:
    listed = _ip("netns", "pids", ns)
    for pid in listed.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _remove_stale() -> None:
    """Namespaces left by an earlier run of this test that was itself killed."""
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        digits = name[len(PREFIX) : -1]
        if name.startswith(PREFIX) and digits.isdigit() and not Path(f"/proc/{digits}").exists():
            _kill_namespace_processes(name)
            _ip("netns", "del", name)
            shutil.rmtree(ETC_NETNS / name, ignore_errors=True)


def _unavailable() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: apt-get install iproute2 util-linux)"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    return None


def _reports(out: Path) -> dict[int, dict[str, Any]]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


def _failure(out: Path, logs: list[Path], what: str) -> str:
    reports = _reports(out)
    errors = "\n".join(f"rank {r}:\n{v['error']}" for r, v in reports.items() if "error" in v)
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
    return f"{what}\n{errors}\n{tails}"


def _wait(condition: Any, deadline: float, nodes: list[subprocess.Popen], out: Path) -> bool:
    """Polls `condition` until the deadline; gives up early once a rank or a node failed."""
    while time.monotonic() < deadline:
        if condition():
            return True
        failed = any("error" in r for r in _reports(out).values())
        if failed or any(node.poll() not in (None, 0) for node in nodes):
            return False
        time.sleep(0.2)
    return condition()


@pytest.fixture(scope="module")
def two_host_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Runs the 2 x 2 job, takes the link down while the ranks loop on all_reduce, and
    returns {"reports": rank -> report, "link_down_at": wall-clock time}."""
    reason = _unavailable()
    if reason:
        cannot_run(reason)
    out = tmp_path_factory.mktemp("multihost")
    hosts = TwoHosts()
    try:
        try:
            hosts.create()
        except OSError as error:
            cannot_run(f"cannot build two hosts from network namespaces: {error}")
        env = clean_env(MULTIHOST_OUT=str(out), MULTIHOST_LINK_TIMEOUT_S=str(LINK_TIMEOUT_S))
        for name in ("TORCHNEURON_DIST_TRANSPORT", "GLOO_SOCKET_IFNAME", "MASTER_ADDR"):
            env.pop(name, None)
        rank_program = str(Path(__file__).parent / "support" / "multihost_rank.py")
        logs = [out / f"{host}.log" for host in HOSTS]
        nodes = []
        for i in range(2):
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
            argv += ["--nproc-per-node", "2", "--node-rank", str(i), "--master-addr", HOSTS[0]]
            argv += ["--master-port", "29500", rank_program]  # the port is the namespace's own
            nodes.append(hosts.start(i, argv, env, logs[i]))

        def looping() -> bool:
            return len(list(out.glob("ready*"))) == 4

        if not _wait(looping, time.monotonic() + START_DEADLINE_S, nodes, out):
            pytest.fail(_failure(out, logs, "the ranks did not all reach the link-down loop"))
        time.sleep(1.0)  # let the ranks be inside a collective, a few rounds in
        link_down_at = time.time()
        hosts.link_down()

        def reported() -> bool:
            return len(_reports(out)) == 4

        deadline = time.monotonic() + LINK_TIMEOUT_S + 60
        if not _wait(reported, deadline, nodes, out):
            pytest.fail(_failure(out, logs, "not every rank reported after the link went down"))
        reports = _reports(out)
        if any("error" in r for r in reports.values()):
            pytest.fail(_failure(out, logs, "a rank failed"))
        yield {"reports": reports, "link_down_at": link_down_at}
    finally:
        hosts.stop()  # the agents wait for each other over the dead link: not worth waiting
        hosts.remove()


def test_transport_is_chosen_per_group_by_host(two_host_job):
    """Ranks 0, 1 run on node0 and 2, 3 on node1. Groups whose ranks span the hosts use Gloo;
    the intra-host groups (one dimension of a 2-D device mesh) use shared memory, even though
    Gloo carries the world group. Collectives across hosts matched closed forms (in the ranks)."""
    reports = two_host_job["reports"]
    assert {r: v["host"] for r, v in reports.items()} == {
        0: "node0",
        1: "node0",
        2: "node1",
        3: "node1",
    }
    for rank, report in reports.items():
        assert report["transport"] == {"world": "gloo", "local": "shm", "host": "gloo"}, rank
        assert report["device"] == report["local_rank"] == rank % 2  # LOCAL_RANK chose it
        # ranks {0, 1} and {2, 3} sum their own ranks over shared memory
        assert report["local_sum"] == {0: 1.0, 1: 1.0, 2: 5.0, 3: 5.0}[rank]


def test_fsdp2_step_across_hosts_equals_one_device(two_host_job):
    """Two SGD steps of the tiny MLP, batch split over four ranks on two hosts, equal the same
    steps on one device (float32, atol 1e-5 / rtol 1e-4): FSDP2 sharded over all four ranks
    (Gloo) and HSDP (sharded within a host over shared memory, replicated across over Gloo)."""
    reference = [p.detach().flatten() for p in _single_device_reference().parameters()]
    for rank, report in two_host_job["reports"].items():
        for layout in ("fsdp", "hsdp"):
            got = [torch.tensor(values) for values in report[layout]]
            assert len(got) == len(reference)
            for i, (g, want) in enumerate(zip(got, reference, strict=True)):
                torch.testing.assert_close(g, want, **TOL, msg=f"rank {rank} {layout} param {i}")


def test_link_down_is_reported_within_the_group_timeout_naming_the_peers(two_host_job):
    """With the veth link taken down while every rank loops on all_reduce over a group with a
    10 s timeout, every rank raises within 10 s (+5 s scheduling slack) of the link going down,
    and its error names the ranks and host on the other side (Gloo's own message does not)."""
    down = two_host_job["link_down_at"]
    peers = {"node0": "ranks 2, 3 on host node1", "node1": "ranks 0, 1 on host node0"}
    for rank, report in two_host_job["reports"].items():
        assert report["rounds_before_link_down"] > 0, rank  # the loop did run collectives
        message = report.get("link_error")
        assert message is not None, f"rank {rank}: no error {LINK_TIMEOUT_S + 120} s after"
        waited = report["link_error_at"] - down
        assert 0 < waited < LINK_TIMEOUT_S + SLACK_S, f"rank {rank} raised {waited:.1f} s after"
        assert f"{LINK_TIMEOUT_S * 1000}ms" in message, message  # the group's timeout fired
        assert peers[report["host"]] in message, message


PRIVATE_SHM_RANK = """
import datetime, torch, torch.distributed as dist
from torchneuron.distributed.process_group import transport
dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=20))
t = torch.full((4,), float(dist.get_rank() + 1), device="neuron")
dist.all_reduce(t)
print("transport", transport(), t.cpu().tolist(), flush=True)
dist.destroy_process_group()
"""


def test_a_rank_with_its_own_dev_shm_counts_as_another_host():
    """Two ranks with one host name and boot id but different /dev/shm mounts (containers
    sharing the host's network and UTS namespaces, not its IPC/shm: docker --network=host
    without --ipc=host) cannot meet in shared memory: they must choose Gloo and work
    (regression: they chose shared memory, and rank 1 could not open rank 0's segment)."""
    reason = _unavailable()
    if reason:
        cannot_run(reason)
    private_shm = 'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"'
    probe = subprocess.run(
        ["unshare", "--mount", "sh", "-c", private_shm, "sh", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        cannot_run(f"cannot mount a private /dev/shm: {probe.stderr.strip()}")
    from support.ranks import free_port

    port = str(free_port())
    ranks = []
    for rank in range(2):
        env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2")
        env.update(RANK=str(rank), LOCAL_RANK=str(rank))
        env.pop("TORCHNEURON_DIST_TRANSPORT", None)
        argv = [sys.executable, "-c", PRIVATE_SHM_RANK]
        if rank == 1:
            argv = ["unshare", "--mount", "sh", "-c", private_shm, "sh", *argv]
        ranks.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outputs = []
    for process in ranks:
        try:
            out, err = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        outputs.append((process.returncode, out, err[-3000:]))
    for code, out, err in outputs:
        assert code == 0 and "transport gloo [3.0, 3.0, 3.0, 3.0]" in out, (code, out, err)
