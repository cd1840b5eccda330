"""The process's memory allocator for training: mimalloc where its library is installed (Linux), else the C library's.

Why: CPU training allocates and frees the same megabyte-sized activation buffers at every micro-batch. glibc's
malloc keeps them on a heap that fragments (peak RSS far above what is live; mens/train/host_memory.py), and its
fix (a fixed mmap threshold) costs a page fault per buffer. mimalloc with purging off (MIMALLOC_PURGE_DELAY=-1:
freed pages stay with the process for reuse) avoids both. On SmolLM2-135M, 2 AMD EPYC cores, training peaked at
0.72x (LoRA) and about 0.6x (QLoRA) glibc's RSS at the same or a few percent more tokens/s, and dogfood's answer
generation ran ~20% faster (bench/results/train_speed-lora-alloc-vm.json, train_speed-mimalloc-vm.json,
dogfood-budget30-mimalloc-vm.json), with bit-identical losses: an allocator hands out memory, it does not change
the arithmetic.

How: an allocator must be in place before the process's first malloc, so `mens train`, `mens dogfood` and `mens
pretrain` re-execute themselves once with LD_PRELOAD naming mimalloc, as torch's own CPU launcher
(torch.backends.xeon.run_cpu) does for jemalloc and tcmalloc. The library comes from the PyPI package
`cmeel-mimalloc` (a plain shared library, nothing imported into Python). The re-executed process gives its
children the LD_PRELOAD they would have had, so tools it starts are untouched (a child `mens train` re-executes
itself).

MENS_ALLOCATOR=system keeps the C library's malloc (and makes `host_memory: lean` apply). The default (auto) also
keeps it where an NVIDIA driver is loaded: a GPU run's host allocations were not measured. An LD_PRELOAD that
already names an allocator is the user's choice and is kept. Torch is not imported here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

CHOICE = "MENS_ALLOCATOR"
"""auto (the default: mimalloc where installed, on machines without an NVIDIA driver), mimalloc or system."""
CHOICES = ("auto", "mimalloc", "system")
NVIDIA_DRIVER = Path("/proc/driver/nvidia")
"""Present where an NVIDIA driver is loaded: `auto` stays on the C library's malloc there, since mimalloc was
measured on CPU training only (MENS_ALLOCATOR=mimalloc asks for it on a GPU machine too)."""
PRELOADED = "MENS_ALLOCATOR_PRELOADED"
"""Set in the re-executed process only: the LD_PRELOAD its parent had, to give back to its own children."""
COMMANDS = ("train", "dogfood", "pretrain")
"""The commands that train: measured on `mens train`'s loop, which dogfood runs; pretrain's is the same kind of work."""
_ALLOCATOR_NAMES = ("malloc", "hoard")  # libmimalloc, libjemalloc, libtcmalloc... all name malloc


def library() -> Path | None:
    """mimalloc's shared library from the installed `cmeel-mimalloc` package, or None."""
    from importlib import metadata

    try:
        dist = metadata.distribution("cmeel-mimalloc")
    except metadata.PackageNotFoundError:
        return None
    lib = Path(str(dist.locate_file("cmeel.prefix/lib/libmimalloc.so")))
    return lib if lib.is_file() else None


def preload_env(environ: Mapping[str, str], lib: Path | None = None,
                gpu_driver: bool | None = None) -> dict[str, str] | None:
    """The environment to re-execute this process with so that mimalloc is its allocator; None to run as it is.

    None when: not Linux, already re-executed, MENS_ALLOCATOR is system (or not a known value: `choice_problem`),
    or auto on a machine with an NVIDIA driver, LD_PRELOAD already names an allocator, or the library is not
    installed.
    """
    if not sys.platform.startswith("linux") or PRELOADED in environ:
        return None
    wanted = choice(environ)
    if wanted == "auto":
        wanted = "system" if (NVIDIA_DRIVER.exists() if gpu_driver is None else gpu_driver) else "mimalloc"
    if wanted != "mimalloc":
        return None
    preload = environ.get("LD_PRELOAD", "")
    if any(name in Path(p).name for p in preload.replace(":", " ").split() for name in _ALLOCATOR_NAMES):
        return None
    lib = lib or library()
    if lib is None:
        return None
    env = dict(environ)
    env["LD_PRELOAD"] = ":".join(p for p in (str(lib), preload) if p)
    # keep freed pages for reuse: with its default purging mimalloc ran ~15% slower than glibc (docs/benchmarks.md)
    env.setdefault("MIMALLOC_PURGE_DELAY", "-1")
    env[PRELOADED] = preload
    return env


def choice(environ: Mapping[str, str]) -> str:
    """MENS_ALLOCATOR as given ("auto" when unset or empty), lower-cased."""
    return environ.get(CHOICE, "").strip().lower() or "auto"


def choice_problem(environ: Mapping[str, str]) -> str | None:
    """A one-line error for a MENS_ALLOCATOR value that is not one of CHOICES, else None."""
    if choice(environ) in CHOICES:
        return None
    return (f"{CHOICE}={environ.get(CHOICE)!r}: expected 'auto' (the default: mimalloc where installed, unless an "
            "NVIDIA driver is loaded), 'mimalloc' or 'system' (the C library's malloc)")


def command_line(args: list[str]) -> list[str]:
    """This process's own command line to start again: the interpreter's options kept (`python -u -m mens ...`
    under torchrun, the `mens` console script), else `python -m mens ARGS`."""
    orig = getattr(sys, "orig_argv", None)
    return [sys.executable, *orig[1:]] if orig else [sys.executable, "-m", "mens", *args]


def reexec(args: list[str], environ: MutableMapping[str, str] = os.environ) -> None:
    """Replace this process by itself with mimalloc preloaded, when `preload_env` says so.

    Returns only when nothing is to be done, or when the exec itself failed (the command then runs on as it is).
    """
    env = preload_env(environ)
    if env is None or not sys.executable:  # an embedded interpreter has no executable to start again
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, command_line(args), env)
    except OSError:
        return


def settle(environ: MutableMapping[str, str] = os.environ) -> None:
    """In a re-executed process: give the environment back its parent's LD_PRELOAD, so children start as they
    would have (the allocator of this process is loaded already and stays)."""
    if PRELOADED not in environ:
        return
    original = environ.pop(PRELOADED)
    if original:
        environ["LD_PRELOAD"] = original
    else:
        environ.pop("LD_PRELOAD", None)


def in_use() -> str:
    """The allocator this process runs on: "mimalloc" when its library is mapped, else "system"."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "system"
    return "mimalloc" if "libmimalloc" in maps else "system"
