"""GPU metrics through NVML (the `pynvml` module of nvidia-ml-py), with Triton's names and its
`gpu_uuid` label. Where pynvml is not installed, or NVML finds no driver or no GPU, there are
no GPU metrics at all; a reading a GPU does not support leaves out that one sample."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Device:
    uuid: str
    handle: Any
    energy_at_start_mj: int | None  # Triton counts energy from its own start


class GpuMetrics:
    """Reads every GPU NVML sees at each scrape."""

    def __init__(self, nvml: Any, devices: list[_Device]) -> None:
        self._nvml = nvml
        self._devices = devices

    @classmethod
    def open(cls, nvml: Any = None) -> GpuMetrics | None:
        """NVML's view of the GPUs, or None where there is none to be had. `nvml` is the pynvml
        module (imported here when not given)."""
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                return None
        try:
            nvml.nvmlInit()
        except Exception as error:  # no driver, no GPU: no GPU metrics, and no error
            log.debug("no GPU metrics: NVML did not start (%s)", error)
            return None
        devices = []
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                if isinstance(uuid, bytes):  # older pynvml
                    uuid = uuid.decode()
                energy = _reading(lambda h=handle: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
                devices.append(_Device(uuid, handle, energy))
        except Exception as error:
            log.warning("no GPU metrics: NVML could not list the GPUs (%s)", error)
            devices = []
        if not devices:
            nvml.nvmlShutdown()
            return None
        log.info("GPU metrics for %d GPU(s)", len(devices))
        return cls(nvml, devices)

    def close(self) -> None:
        self._nvml.nvmlShutdown()

    def collect(self) -> Iterator[Metric]:
        nvml = self._nvml
        families = (
            (
                "nv_gpu_utilization",
                "GPU utilization rate [0.0 - 1.0]",
                "gauge",
                lambda device: nvml.nvmlDeviceGetUtilizationRates(device.handle).gpu / 100,
            ),
            (
                "nv_gpu_memory_total_bytes",
                "GPU memory, in bytes",
                "gauge",
                lambda device: nvml.nvmlDeviceGetMemoryInfo(device.handle).total,
            ),
            (
                "nv_gpu_memory_used_bytes",
                "GPU memory in use, in bytes",
                "gauge",
                lambda device: nvml.nvmlDeviceGetMemoryInfo(device.handle).used,
            ),
            (
                "nv_gpu_power_usage",
                "GPU power draw, in watts",
                "gauge",
                lambda device: nvml.nvmlDeviceGetPowerUsage(device.handle) / 1000,
            ),
            (
                "nv_gpu_power_limit",
                "GPU power limit, in watts",
                "gauge",
                lambda device: nvml.nvmlDeviceGetEnforcedPowerLimit(device.handle) / 1000,
            ),
            (
                "nv_energy_consumption",
                "GPU energy used since the server started, in joules",
                "counter",
                self._energy_joules,
            ),
        )
        for name, documentation, kind, read in families:
            family = Metric(name, documentation, kind)
            for device in self._devices:
                value = _reading(lambda device=device, read=read: read(device))
                if value is not None:
                    family.add_sample(name, {"gpu_uuid": device.uuid}, value)
            yield family

    def _energy_joules(self, device: _Device) -> float | None:
        if device.energy_at_start_mj is None:
            return None
        now = self._nvml.nvmlDeviceGetTotalEnergyConsumption(device.handle)
        return (now - device.energy_at_start_mj) / 1000


def _reading(read: Callable[[], Any]) -> Any:
    """A value NVML may not have for this GPU (NVMLError: not supported, GPU lost)."""
    try:
        return read()
    except Exception:
        return None
