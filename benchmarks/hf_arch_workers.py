"""Worker processes for the coverage run: one architecture at a time, with time limits.

Each worker is ``hf_arch_coverage.py --worker`` (see ``hf_arch_run.worker_main``); a worker
that hangs or dies is replaced, and one is recycled after ``--recycle`` architectures.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

from hf_arch_run import READY_TAG, RESULT_TAG, STAGE_TAG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the command-line entry point; it runs a worker when given --worker
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_arch_coverage.py")


class Worker:
    """A worker process fed one architecture at a time."""

    def __init__(self, args, cpu_only: bool, log_dir: str) -> None:
        cmd = [
            sys.executable,
            SCRIPT,
            "--worker",
            "--threads",
            str(args.threads),
        ]
        env = dict(os.environ)
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
        if cpu_only:
            cmd.append("--cpu-only")
            env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        env.setdefault("HF_HUB_OFFLINE", "1")
        env["PYTHONUNBUFFERED"] = "1"
        self.log_path = os.path.join(log_dir, f"worker-{time.time_ns()}.log")
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines: queue.Queue = queue.Queue()
        self.stage = "starting"
        threading.Thread(target=self._read, daemon=True).start()
        self.served = 0

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, tag: str, timeout: float):
        """The payload after `tag`, or None on timeout / exit."""
        deadline = time.time() + timeout
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                return "timeout"
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                return "timeout"
            if line is None:
                return "exit"
            if line.startswith(STAGE_TAG):
                self.stage = line[len(STAGE_TAG) :].strip()
            elif line.startswith(tag):
                return line[len(tag) :]

    def submit(self, name: str, compiled: bool) -> None:
        self.stage = f"{name} queued"
        self.proc.stdin.write(name + (" compiled" if compiled else "") + "\n")
        self.proc.stdin.flush()
        self.served += 1

    def stderr_tail(self, n: int = 6) -> str:
        self.log.flush()
        try:
            with open(self.log_path) as f:
                lines = [ln.rstrip() for ln in f if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-n:])[-600:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Runner:
    def __init__(self, args, cpu_only: bool, log_dir: str) -> None:
        self.args, self.cpu_only, self.log_dir = args, cpu_only, log_dir
        self.worker: Worker | None = None

    def _ensure(self) -> Worker:
        if self.worker is not None and self.worker.served >= self.args.recycle:
            self.worker.stop()
            self.worker = None
        while self.worker is None:
            w = Worker(self.args, self.cpu_only, self.log_dir)
            if w.wait_for(READY_TAG, 600) is not None and w.proc.poll() is None:
                self.worker = w
            else:
                tail = w.stderr_tail()
                w.kill()
                print(f"[coverage] worker failed to start ({tail}); retrying in 30 s", flush=True)
                time.sleep(30)
        return self.worker

    def run(self, name: str, compiled: bool = False) -> dict:
        timeout = self.args.timeout + (self.args.compile_timeout if compiled else 0.0)
        for attempt in range(2):
            w = self._ensure()
            w.submit(name, compiled)
            payload = w.wait_for(RESULT_TAG, timeout)
            if payload not in ("timeout", "exit", None):
                return json.loads(payload)
            stage = w.stage
            if payload == "timeout":
                w.kill()
                self.worker = None
                return {
                    "arch": name,
                    "cpu_ok": None,
                    "timeout": True,
                    "harness_error": f"time limit {timeout:.0f} s hit during '{stage}'",
                }
            code = w.proc.wait()
            tail = w.stderr_tail()
            w.kill()
            self.worker = None
            if attempt == 0:
                continue  # a crash may be a rebuild of the extension under us: retry once
            return {
                "arch": name,
                "cpu_ok": None,
                "crash": True,
                "harness_error": f"worker died (exit {code}) during '{stage}': {tail}",
            }
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
