"""Child processes under `--simulate`: DataLoader workers run as they run on a GPU machine.

A training script loads its data in worker processes (`DataLoader(num_workers=2,
pin_memory=True)`), started by fork, spawn or forkserver. On a GPU machine the workers read and
collate on the CPU, the batches come back as CPU tensors, and the main process moves them to the
GPU. Under the simulation the same holds, with what a child needs to see the same machine:

- fork: the child is a copy of the simulated process (its overlay, its simulated CUDA);
  multiprocessing's socket folder is a real temporary directory (machine/disk.py), so the batches'
  shared memory is handed over as on any machine.
- spawn and forkserver: the child is a new interpreter that imports the script again (as
  `__mp_main__`). Before it does, it arms the parent's overlay (its writes land in the parent's
  scratch, listed in the report's `writes`) and a simulated CUDA of the same GPU, so the script's
  top level reads the machine it reads in the parent and never writes the user's files. The
  forkserver's server process, which would import the script with neither, does not preload it.
- pinned memory: the pin thread DataLoader starts runs under the parent's function modes (a
  thread starts with none), so a batch is pinned as the simulation pins it.
- the script's own processes (`mp.Process(target=train)`, as pytorch/examples' mnist_hogwild trains
  its shared model): a spawned one is armed as a worker is, on the machine asked for (a Mac's face
  for `--device mps`), and arms its own children and pin threads the same way, so its DataLoader
  (`pin_memory=True`) and its training step run as on that machine. Its step is not traced: the
  report is the parent's step; what a child meets is said in one line.

What a child writes to stderr (a traceback, a warning) goes to a file the parent reads, never to
the user's terminal: a child that failed stops the loader's wait at once with one line naming
the worker and its error (the parent would otherwise wait on a worker that never delivers);
what a child printed otherwise is said in one line each when the run ends.

A worker that is alive and delivers nothing (a `__getitem__` that blocks) would hold the loader's
wait until the run's --timeout stops the script somewhere in DataLoader. The wait is bounded by
that limit instead: a moment before it (a tenth of --timeout, 0.5 to 2 s), the parent asks the
worker that owes the awaited batch where it is (faulthandler's dump of its stack, armed in every
child on SIGUSR1 into its captured stderr), ends it, and stops the run as its --timeout would, in
one line: "waiting on DataLoader worker process 1 (pid N, spawn) for 12.0 s, which was at
data.py:9 in __getitem__". With --timeout 0 (no limit) the wait is as unbounded as the script's.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

_TRACEBACK = "Traceback (most recent call last)"
_ASK_WHERE = getattr(signal, "SIGUSR1", None)  # a child dumps its stack on it (faulthandler)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)', re.M)
_CURRENT: "Children | None" = None


@dataclass(frozen=True)
class ChildArms:
    """What a spawned child arms before it imports the script (pickled into spawn's preparation data)."""

    disk: tuple[Any, ...] | None  # Overlay.state()
    capture: str  # the folder its stderr goes to
    device: str  # the simulated device the parent's script sees ("cuda:0")
    gpu: str | None  # the GPU profile's name
    gpus: int
    macos: tuple[int, int] | None = None  # a simulated Mac's (--device mps): the child sees a Mac, not CUDA

    def __reduce__(self) -> tuple[Callable[..., None], tuple[Any, ...]]:
        return _Armed, (self.disk, self.capture, self.device, self.gpu, self.gpus, self.macos)


def _Armed(disk: Any, capture: str, device: str, gpu: str | None, gpus: int,  # noqa: N802 - pickle's callable
           macos: tuple[int, int] | None = None) -> None:
    """Run in a spawned child as spawn's preparation data is unpickled, before the script is imported."""
    _capture_stderr(capture)
    if disk is not None:
        from dtype_doctor.machine.disk import Overlay

        Overlay.joined(disk)
    try:
        import torch

        from dtype_doctor.machine.gpus import gpu_profile
        from dtype_doctor.machine.simulate import CudaSimulation

        sim = CudaSimulation(torch.device(device), gpu_profile(gpu), gpus=gpus, stops=False).__enter__()
        if macos is not None:
            from dtype_doctor.machine.mps_simulation import MpsFace

            MpsFace(sim, macos).__enter__()
        # its own children and pin threads as the parent's (a training process's DataLoader, pin_memory=True)
        Children(None, device, gpu, gpus, macos).adopt(ChildArms(disk, capture, device, gpu, gpus, macos))
    except Exception as e:  # noqa: BLE001 - the child goes on as the plain CPU process it is, and says so
        print(f"{_TRACEBACK} (dtype-doctor)\nthe simulated CUDA could not be armed in this worker: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)


def _capture_stderr(folder: str) -> None:
    """This process's stderr (fd 2, so C code's too) into `folder`/<pid>.err."""
    sys.stderr.flush()
    fd = os.open(os.path.join(folder, f"{os.getpid()}.err"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    # Python's stderr too, which need not be fd 2 (a test's capture, a notebook's stream): tracebacks print there.
    sys.stderr = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    if _ASK_WHERE is not None:
        import faulthandler

        faulthandler.register(_ASK_WHERE, file=sys.stderr, all_threads=True)  # the parent asks where a hung worker is
        with open(os.path.join(folder, f"{os.getpid()}.ready"), "w"):  # only now may the parent ask (SIGUSR1 ends a
            pass  # child without the handler: a spawned worker still importing under load died "killed by signal")


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class Children:
    """`with Children(disk, device, gpu, gpus):` — child processes the script starts see the simulated
    machine, and what they meet is the parent's to say (`said()` after the run: one line a child)."""

    def __init__(self, disk: Any, device: str, gpu: str | None, gpus: int = 1, macos: tuple[int, int] | None = None) -> None:
        self.disk = disk
        self.device, self.gpu, self.gpus, self.macos = device, gpu, gpus, macos
        self._arms: ChildArms | None = None  # a spawned child's own arms, handed down to its children
        self.capture = ""
        self.reported: set[int] = set()
        self._saved: list[tuple[Any, str, Any]] = []
        self._hook: Any = None
        self._waits: dict[int, tuple[int, float]] = {}  # id(loader iterator) → (the batch it awaits, since when)
        self.own: list[str] = []  # the script's own processes (not DataLoader workers): "train (spawn)"

    def arms(self) -> ChildArms:
        if self._arms is not None:
            return self._arms
        return ChildArms(self.disk.state() if self.disk is not None else None, self.capture, self.device, self.gpu,
                         self.gpus, self.macos)

    def adopt(self, arms: ChildArms) -> None:
        """In a spawned child: its own children are armed as it was, and its pin threads run under its modes.
        Never exited: the child's patches last as long as the child."""
        self._arms, self.capture = arms, arms.capture
        self._patch()

    def __enter__(self) -> "Children":
        import tempfile

        self.capture = tempfile.mkdtemp(prefix="dtype-doctor-children-")  # owned: a fresh name in the temp dir
        self._patch()
        self._quiet_forkserver()
        self._patch_loader()
        return self

    def _patch(self) -> None:
        """Forked children capture their stderr; spawned ones unpickle the arms before the script is imported."""
        global _CURRENT
        import multiprocessing
        import multiprocessing.process
        import multiprocessing.spawn

        children = self
        bootstrap = multiprocessing.process.BaseProcess._bootstrap
        prepared = multiprocessing.spawn.get_preparation_data

        def _bootstrap(process: Any, *args: Any, **kwargs: Any) -> Any:
            if _CURRENT is children:
                _capture_stderr(children.capture)  # a forked child: already the simulated process
            return bootstrap(process, *args, **kwargs)

        def get_preparation_data(name: str) -> dict[str, Any]:
            data = prepared(name)
            data["dtype_doctor"] = children.arms()  # unpickled (and armed) before prepare() imports the script
            return data

        self._set(multiprocessing.process.BaseProcess, "_bootstrap", _bootstrap)
        self._set(multiprocessing.spawn, "get_preparation_data", get_preparation_data)
        start = multiprocessing.process.BaseProcess.start

        def started(process: Any) -> None:
            target = getattr(process, "_target", None)
            if getattr(target, "__module__", "") != "torch.utils.data._utils.worker":  # a DataLoader worker is the loader's
                method = getattr(process, "_start_method", None) or multiprocessing.get_start_method(allow_none=True) or "fork"
                children.own.append(f"{getattr(target, '__name__', None) or process.name} ({method})")
            return start(process)

        self._set(multiprocessing.process.BaseProcess, "start", started)
        _CURRENT = self
        if self._arms is not None:  # a child: its pin threads under its modes (the loader's bounded wait is the parent's)
            import torch.utils.data._utils.pin_memory as pin

            self._set(pin, "_pin_memory_loop", _with_modes(pin._pin_memory_loop))

    def _quiet_forkserver(self) -> None:
        """The forkserver's server process would import the script before any arming: it preloads nothing."""
        import multiprocessing.forkserver as forkserver

        server = getattr(forkserver, "_forkserver", None)
        if server is not None and hasattr(server, "_preload_modules"):
            self._set(server, "_preload_modules", [m for m in server._preload_modules if m != "__main__"])

    def _patch_loader(self) -> None:
        from dtype_doctor.machine.libraries import after_import

        def patch(dataloader: Any) -> None:
            it = getattr(dataloader, "_MultiProcessingDataLoaderIter", None)
            if it is not None:
                self._set(it, "_try_get_data", self._bounded(it._try_get_data))

        self._hook = after_import("torch.utils.data.dataloader", patch)
        import torch.utils.data._utils.pin_memory as pin

        self._set(pin, "_pin_memory_loop", _with_modes(pin._pin_memory_loop))

    def _bounded(self, original: Callable[..., Any]) -> Callable[..., Any]:
        children = self
        from dtype_doctor.machine.control import time_left

        def _try_get_data(it: Any, timeout: float = 5.0) -> Any:
            left = time_left()
            if left is not None:  # wake in time to say which worker the run waited on
                timeout = max(0.05, min(timeout, left[0] - _margin(left[1])))
            started = children._waits.setdefault(id(it), (it._rcvd_idx, time.monotonic()))
            if started[0] != it._rcvd_idx:
                started = children._waits[id(it)] = (it._rcvd_idx, time.monotonic())
            try:
                got = original(it, timeout)
            except RuntimeError:
                children.raise_failed(it)  # a worker died: its own error, not only "exited unexpectedly"
                raise
            if not got[0]:
                children.raise_failed(it)
                left = time_left()
                if left is not None and left[0] <= _margin(left[1]):
                    children.stop_hung(it, time.monotonic() - started[1])
            return got

        return _try_get_data

    def stop_hung(self, it: Any, waited: float) -> None:
        """The run's --timeout is all but spent on the loader `it`'s wait: stop it, naming the worker that owes the
        batch and where that worker is."""
        from dtype_doctor.machine.control import stop_waiting

        info = it._task_info.get(it._rcvd_idx) if hasattr(it, "_task_info") else None
        workers = list(getattr(it, "_workers", ()))
        if not info or len(info) != 1 or not 0 <= info[0] < len(workers):
            stop_waiting(f"waiting on its DataLoader workers for {waited:.1f} s")
        k = info[0]
        w = workers[k]
        at = self._where(w.pid)
        self.reported.add(w.pid)
        if w.is_alive():
            # Its batch never comes, and the loader's shutdown would wait on it again: ended here, once the loader no
            # longer watches its workers (DataLoader's SIGCHLD handler would raise "killed by signal" into the script).
            from torch.utils.data._utils import signal_handling

            if getattr(it, "_worker_pids_set", False):
                signal_handling._remove_worker_pids(id(it))
                it._worker_pids_set = False
            w.terminate()
        stop_waiting(f"waiting on DataLoader worker process {k} (pid {w.pid}, {_method(w)}) for {waited:.1f} s"
                     + (f", {at}" if at else ""))

    def _where(self, pid: int | None) -> str:
        """Where the child `pid` is now: the innermost frame of the user's files in its stack, else its innermost frame."""
        if pid is None or _ASK_WHERE is None:
            return ""
        if not os.path.exists(os.path.join(self.capture, f"{pid}.ready")):
            return "which had not started yet"
        before = len(self._read(pid))
        try:
            os.kill(pid, _ASK_WHERE)
        except OSError:
            return ""
        frames: list[re.Match[str]] = []
        for _ in range(40):  # the dump is written by the child's signal handler: a few ms
            time.sleep(0.025)
            frames = list(_FRAME.finditer(self._read(pid)[before:]))
            if frames:
                break
        from dtype_doctor.machine.user_code import display_path, is_user_file

        if not frames:
            return ""
        mine = [f for f in frames if is_user_file(f["file"])]
        f = (mine or frames)[0]
        return f"which was at {display_path(f['file']) if mine else os.path.basename(f['file'])}:{f['line']} in {f['fn']}"

    def raise_failed(self, it: Any) -> None:
        """RuntimeError in one line when one of the loader `it`'s workers wrote a traceback."""
        failed = []
        for k, w in enumerate(getattr(it, "_workers", ())):
            text = self._read(w.pid)
            if w.pid is not None and _TRACEBACK in text and w.pid not in self.reported:
                failed.append((k, w, text))
        if failed:
            k, w, text = failed[0]
            self.reported.update(f[1].pid for f in failed)
            more = f" (and {len(failed) - 1} more worker{'s' if len(failed) > 2 else ''})" if len(failed) > 1 else ""
            raise RuntimeError(f"DataLoader worker process {k} (pid {w.pid}, {_method(w)}) "
                               f"failed under the simulation: {last_line(text)}{more}") from None

    def _read(self, pid: int | None) -> str:
        try:
            with open(os.path.join(self.capture, f"{pid}.err"), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except (OSError, TypeError):
            return ""

    def said(self) -> list[str]:
        """One line for each child that wrote to stderr and was not reported already; and, where the script
        started processes of its own, that they ran on the simulated machine with their steps untraced."""
        out = []
        if self.own:
            out.append(f"the script's own processes ran under the simulation, their steps not traced (the report is "
                       f"this process's step): {', '.join(self.own)}")
        for name in sorted(os.listdir(self.capture)) if self.capture and os.path.isdir(self.capture) else ():
            pid = int(name.split(".")[0]) if name.endswith(".err") and name.split(".")[0].isdigit() else None
            text = self._read(pid)
            if pid is None or pid in self.reported or not text.strip():
                continue
            kind = "failed" if _TRACEBACK in text else "wrote to stderr"
            out.append(f"a child process (pid {pid}) {kind}: {last_line(text)}")
        return out

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def __exit__(self, *exc: Any) -> None:
        global _CURRENT
        _CURRENT = None
        if self._hook is not None and self._hook in sys.meta_path:
            sys.meta_path.remove(self._hook)
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        for line in self.said():
            print(f"dtype-doctor: {line}", file=sys.stderr)
        import shutil

        shutil.rmtree(self.capture, ignore_errors=True)


def _margin(timeout: float) -> float:
    """How long before the run's --timeout a loader's wait ends to say what it waited on."""
    return min(2.0, max(0.5, timeout / 10))


def _method(worker: Any) -> str:
    return getattr(worker, "_start_method", None) or "fork"


def _with_modes(loop: Callable[..., Any]) -> Callable[..., Any]:
    """DataLoader's pin-memory loop, run in its thread under the function modes of the thread that started it."""
    from torch.overrides import _get_current_function_mode_stack

    def _pin_memory_loop(*args: Any, **kwargs: Any) -> Any:
        import contextlib

        with contextlib.ExitStack() as stack:
            for mode in modes:
                stack.enter_context(mode)
            return loop(*args, **kwargs)

    modes = list(_get_current_function_mode_stack())
    return _pin_memory_loop
