"""A launched server's process group goes when its trainer is SIGKILLed (``lit_fgrpo.servers.watchdog``).

Real processes, no vLLM: a "trainer" process starts a "server" the way ``ServerProcess.start`` does (its own
session, so its own process group) running the launcher's watchdog and a child of its own (as a vLLM server's engine
core is), then the test SIGKILLs the trainer, which runs no handler, and waits for the whole group to go. A vLLM
server is not needed for this: what is tested is the watchdog's parent check and group kill, which run the same in
front of ``vllm serve`` (the launcher starts the thread before it hands over to vLLM's CLI).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

SERVER = textwrap.dedent(
    """
    import subprocess, sys, time
    from lit_fgrpo.servers.watchdog import exit_with
    if sys.argv[1] != "off":
        exit_with(int(sys.argv[1]), poll_s=0.1, grace_s=1.0)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the 'engine core'
    time.sleep(120)
    """
)
TRAINER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    parent = "off" if sys.argv[2] == "off" else str(os.getpid())
    server = subprocess.Popen([sys.executable, "-c", sys.argv[1], parent], start_new_session=True)
    print(server.pid, flush=True)
    time.sleep(120)
    """
)


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    members.append(int(entry))
            except ProcessLookupError:
                pass
    return members


def run_and_kill_trainer(watch: bool, wait_s: float) -> tuple[int, list[int]]:
    """Start a trainer with a server, SIGKILL the trainer; returns (the server's group, its members after wait_s)."""
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, SERVER, "on" if watch else "off"], stdout=subprocess.PIPE, text=True
    )
    assert trainer.stdout is not None
    pgid = int(trainer.stdout.readline())  # the server leads its own group
    deadline = time.monotonic() + 30
    while len(group_members(pgid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the server and its child are up
    assert len(group_members(pgid)) == 2
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + wait_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pgid, group_members(pgid)


def test_a_server_group_goes_when_its_trainer_is_sigkilled() -> None:
    _, left = run_and_kill_trainer(watch=True, wait_s=20)
    assert left == []


def test_without_the_watchdog_the_server_group_outlives_a_sigkilled_trainer() -> None:
    pgid, left = run_and_kill_trainer(watch=False, wait_s=1.5)
    try:
        assert len(left) == 2  # what the watchdog is for: nothing else stops these
    finally:
        os.killpg(pgid, signal.SIGKILL)
