"""How busy the GPU was during a point, and which GPU it was.

`GpuMonitor.start()` polls every GPU's utilization in a background thread for the whole run, from NVML
(`pynvml`) when it loads and finds a GPU, else from `nvidia-smi --query-gpu ... --loop-ms` when it is on
PATH, else not at all (`source` None, every answer None). `busy(start, end)` is each GPU's mean utilization
over the samples taken between two `time.monotonic()` times, and `busy` the busiest one's (the rankers').
NVML's utilization is the share of its last sample period (1/6 s to 1 s, by product) during which at least
one kernel ran: a busy fraction of the device's time, not of its SMs. Polled every 0.1 s, a window's edges
blur by up to a period. `gpu_info()` names the GPUs, their memory and the driver (None without a GPU).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from typing import Any

POLL_S = 0.1
SMI_UTILIZATION = "index,utilization.gpu,memory.used"
SMI_INFO = "index,name,driver_version,memory.total"

# One sample: (time.monotonic(), GPU index, utilization %, memory used MiB).
Sample = tuple[float, int, float, float]


def parse_smi_line(line: str, fields: int) -> list[str] | None:
    """The comma-separated values of one `nvidia-smi --format=csv,noheader,nounits` line, stripped; None
    when it has not `fields` values (a blank or broken line)."""
    values = [value.strip() for value in line.split(",")]
    return values if len(values) == fields and all(values) else None


def parse_smi_sample(line: str, at: float) -> Sample | None:
    """A sample from a line of `nvidia-smi --query-gpu=index,utilization.gpu,memory.used` (None when a
    value is missing or not a number, such as `[N/A]`)."""
    values = parse_smi_line(line, 3)
    if values is None:
        return None
    try:
        return at, int(values[0]), float(values[1]), float(values[2])
    except ValueError:
        return None


def parse_smi_info(text: str) -> list[dict[str, Any]]:
    """The GPUs of `nvidia-smi --query-gpu=index,name,driver_version,memory.total` output."""
    gpus = []
    for line in text.splitlines():
        values = parse_smi_line(line, 4)
        if values is None:
            continue
        index, name, driver, memory = values
        try:
            total: float | None = float(memory)
        except ValueError:  # [N/A]
            total = None
        gpus.append({"index": int(index), "name": name, "driver": driver, "memory_total_mib": total})
    return gpus


def _smi(fields: str, *more: str) -> list[str] | None:
    """The `nvidia-smi` command that queries `fields` as bare CSV; None when it is not on PATH."""
    smi = shutil.which("nvidia-smi")
    return None if smi is None else [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits", *more]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml() -> Any | None:
    """The initialised pynvml module, or None (not installed, no driver, or no GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
        return pynvml
    except Exception:  # an ImportError, or any NVMLError: no NVML here
        return None


def gpu_info() -> dict[str, Any] | None:
    """The GPUs (index, name, driver, total memory) and how they were read; None on a machine without."""
    nvml = _nvml()
    if nvml is not None:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20
            gpus.append({"index": index, "name": _text(nvml.nvmlDeviceGetName(handle)), "driver": driver,
                         "memory_total_mib": round(memory)})  # fmt: skip
        return {"source": "nvml", "gpus": gpus}
    query = _smi(SMI_INFO)
    if query is None:
        return None
    try:
        answer = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = parse_smi_info(answer.stdout)
    return {"source": "nvidia-smi", "gpus": gpus} if gpus else None


class GpuMonitor:
    """Utilization samples of every GPU over a run. `source` is `nvml`, `nvidia-smi` or None."""

    def __init__(self, source: str | None = None) -> None:
        self.source = source
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[str] | None = None

    @classmethod
    def start(cls, poll_s: float = POLL_S) -> GpuMonitor:
        """A monitor polling from NVML, else nvidia-smi, else one that knows nothing (source None)."""
        nvml = _nvml()
        if nvml is not None:
            monitor = cls("nvml")
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

            def run() -> None:
                while not monitor._stop.is_set():
                    at = time.monotonic()
                    with contextlib.suppress(Exception):  # a failed read is a missing sample
                        for index, handle in enumerate(handles):
                            utilization = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                            used = nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
                            monitor.add((at, index, float(utilization), round(used)))
                    monitor._stop.wait(poll_s)

        else:
            query = _smi(SMI_UTILIZATION, f"--loop-ms={round(poll_s * 1000)}")
            if query is None:
                return cls(None)
            try:
                process = subprocess.Popen(
                    query, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
                )
            except OSError:
                return cls(None)
            monitor = cls("nvidia-smi")
            monitor._process = process

            def run() -> None:
                assert process.stdout is not None
                for line in process.stdout:
                    sample = parse_smi_sample(line, time.monotonic())
                    if sample is not None:
                        monitor.add(sample)

        monitor._thread = threading.Thread(target=run, name="gpu-monitor", daemon=True)
        monitor._thread.start()
        return monitor

    def add(self, sample: Sample) -> None:
        with self._lock:
            self._samples.append(sample)

    def busy(self, start: float, end: float) -> dict[str, Any] | None:
        """Mean utilization (a fraction) of each GPU over the samples taken between `start` and `end`, the
        busiest GPU's as `busy`, and the most memory used; None without a source. `busy` is None when no
        sample fell in the window."""
        if self.source is None:
            return None
        with self._lock:
            window = [s for s in self._samples if start <= s[0] <= end]
        per_gpu: dict[int, list[float]] = {}
        for _, index, utilization, _ in window:
            per_gpu.setdefault(index, []).append(utilization / 100)
        means = {str(index): round(sum(v) / len(v), 3) for index, v in sorted(per_gpu.items())}
        return {
            "source": self.source,
            "busy": max(means.values()) if means else None,
            "per_gpu": means,
            "samples": len(window),
            "memory_used_mib_max": max((s[3] for s in window), default=None),
        }

    def close(self) -> None:
        self._stop.set()
        if self._process is not None:
            self._process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)
