"""``rllib train file`` on clusters: an existing cluster (``RAY_ADDRESS``), shared storage on several nodes
(a two-node cluster simulated on this machine), and a single-machine Ray that listens on loopback only."""

from __future__ import annotations

import ipaddress
import os
import re
import time
from pathlib import Path

import psutil
import pytest
import ray
from ray.cluster_utils import Cluster

from gagpo_rllib.tools.cli import main
from gagpo_rllib.tools.train import NodeLocalStorageError, check_storage, filesystem_type
from tests.gagpo_rllib.train_files import (
    assert_same_weights,
    run_weights,
    running_train_file,
    tiny_maze_train_file,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def two_nodes():
    """Two Ray nodes on this machine (``ray.cluster_utils.Cluster``), shut down after the module."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.fixture
def on_cluster(two_nodes, monkeypatch):
    """``RAY_ADDRESS`` set to the running cluster; the CLI connects to it, the test disconnects afterwards."""
    monkeypatch.setenv("RAY_ADDRESS", two_nodes.address)
    yield two_nodes
    ray.shutdown()


def _train_file(folder: Path, model: Path) -> Path:
    path = folder / "maze_tiny.py"
    path.write_text(tiny_maze_train_file(model, tail='stop = {"training_iteration": 1}'))
    return path


def test_a_node_local_folder_is_refused_on_two_nodes(on_cluster, tmp_path: Path, tiny_policy_path) -> None:
    train_file = _train_file(tmp_path, tiny_policy_path)
    with pytest.raises(NodeLocalStorageError, match=r"the Ray cluster has 2 nodes.*s3://bucket/path"):
        main(["train", "file", str(train_file), "--storage", str(tmp_path / "results")])


def test_shared_storage_trains_with_and_without_num_cpus_and_resumes(
    on_cluster, tmp_path: Path, tiny_policy_path, capsys
) -> None:
    """--num-cpus against a running cluster is ignored with a note; the checkpoint is in the shared folder."""
    train_file = _train_file(tmp_path, tiny_policy_path)
    storage = tmp_path / "shared"
    args = ["train", "file", str(train_file), "--storage", str(storage), "--shared-storage"]
    assert main([*args, "--name", "with_cpus", "--num-cpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "note: --num-cpus 2 ignored: connecting to the running cluster at RAY_ADDRESS=" in out
    assert "iter 1/1" in out
    ray.shutdown()
    assert main([*args, "--name", "plain", "--checkpoint-freq", "1"]) == 0
    out = capsys.readouterr().out
    assert "note:" not in out and "iter 1/1" in out
    assert len(ray.nodes()) == 2  # it ran on the two-node cluster, not a Ray of its own
    ray.shutdown()
    assert main([*args, "--resume", str(storage / "plain")]) == 0
    out = capsys.readouterr().out
    found = re.search(r"^checkpoint: (\S+)$", out, flags=re.M)
    assert found, out
    checkpoint = Path(found.group(1))
    assert checkpoint.is_dir() and storage in checkpoint.parents
    assert (checkpoint / "rllib_checkpoint.json").is_file()


def test_storage_is_shared_by_file_system_type_or_uri(on_cluster) -> None:
    ray.init()
    mounts = "/dev/sda1 / ext4 rw 0 0\nserver:/export /mnt/shared nfs4 rw 0 0\nfs /mnt/lustre lustre rw 0 0\n"
    assert filesystem_type("/mnt/shared/runs/x", mounts) == "nfs4"
    assert filesystem_type("/home/me/results", mounts) == "ext4"
    check_storage("/mnt/shared/runs", mounts=mounts)
    check_storage("/mnt/lustre/runs", mounts=mounts)
    check_storage("s3://bucket/runs", mounts=mounts)
    check_storage("/home/me/results", mounts=mounts, shared=True)
    with pytest.raises(NodeLocalStorageError, match="on a 'ext4' file system, local to this node"):
        check_storage("/home/me/results", mounts=mounts)


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _listening(root: psutil.Process) -> list[tuple[int, str, str, int]]:
    """(pid, name, address, port) of every listening TCP socket of ``root`` and its descendants."""
    found = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((proc.pid, proc.name(), conn.laddr.ip, conn.laddr.port))
        except psutil.Error:
            continue
    return found


def test_a_single_machine_run_listens_on_loopback_only(tmp_path: Path, tiny_policy_path) -> None:
    """Every listening socket of the run's Ray processes (GCS, raylet, workers, agents, the driver) is on
    127.0.0.1 while it trains (read with psutil); Ray forces no exception with its node address on loopback."""
    train_file = tmp_path / "maze_tiny.py"
    train_file.write_text(tiny_maze_train_file(tiny_policy_path))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT))
    args = ["--stop", '{"training_iteration": 50}', "--num-cpus", "2", "--storage", str(tmp_path / "results")]
    log: list[str] = []
    sockets: list[tuple[int, str, str, int]] = []
    with running_train_file(train_file, args, cwd=ROOT, env=env) as (proc, lines):
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            while not lines.empty():
                log.append(lines.get())
            if any("iter 1/50" in line for line in log):  # training: Tune, the trial's actor, its workers
                sockets = _listening(psutil.Process(proc.pid))
                break
            time.sleep(1)
    assert sockets, "no listening socket seen\n" + "".join(log[-30:])
    names = {name for _, name, _, _ in sockets}
    assert any("gcs_server" in n for n in names) and any("raylet" in n for n in names), names
    exposed = [s for s in sockets if not _is_loopback(s[2])]
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_an_interrupted_run_resumes_to_the_uninterrupted_weights(tmp_path: Path, tiny_policy_path) -> None:
    """Ctrl-C after iteration 3 of 6 (a checkpoint every iteration, 2 kept), then ``--resume``: the run ends on
    the weights of a run never interrupted, bit for bit, keeping 2 checkpoints and the best."""
    import subprocess
    import sys

    train_file = tmp_path / "maze_tiny.py"
    # Iterations from the 3rd on take 3 s longer (after their update: the weights are untouched), so the
    # interrupt sent on reading "iter 3/6" lands in iteration 4 however fast the machine.
    slow = "\nimport time\n\n\ndef slow_from_3(algorithm, result, **kwargs):\n"
    slow += '    if result["training_iteration"] >= 3:\n        time.sleep(3)\n'
    train_file.write_text(
        tiny_maze_train_file(
            tiny_policy_path, head=slow, config_tail="\n    .callbacks(on_train_result=slow_from_3)"
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT))
    storage = tmp_path / "results"
    common = [
        "--checkpoint-freq",
        "1",
        "--keep-checkpoints",
        "2",
        "--num-cpus",
        "2",
        "--storage-path",
        str(storage),
    ]
    stop = ["--stop", '{"training_iteration": 6}']
    cli = [sys.executable, "-m", "gagpo_rllib.tools.cli", "train", "file", str(train_file)]

    done = subprocess.run(
        [*cli, *stop, *common, "--name", "plain"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-2000:]
    log: list[str] = []
    with running_train_file(train_file, [*stop, *common, "--name", "cut"], cwd=ROOT, env=env) as (
        proc,
        lines,
    ):
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any("iter 3/6" in line for line in log):
            log.append(lines.get(timeout=deadline - time.monotonic()))
    assert not any("iter 6/6" in line for line in log), "the run was not interrupted"
    resumed = subprocess.run(
        [*cli, "--resume", str(storage / "cut"), "--num-cpus", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0 and "iter 6/6" in resumed.stdout, resumed.stdout[-2000:]
    assert sorted(p.name for p in (storage / "cut").rglob("checkpoint_0*")) == [
        "checkpoint_000004",
        "checkpoint_000005",
    ]
    assert len(list((storage / "cut").rglob("best_checkpoint"))) == 1
    assert_same_weights(run_weights(storage / "cut"), run_weights(storage / "plain"))
