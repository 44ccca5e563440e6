"""GPUs through NVML (nvidia-ml-py): absent driver or library means no GPUs, never an error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainhub.service.monitoring import GpuSample

_GB = 1024**3
# NVML clock-event (throttle) reason bits, named as the health rules read them
_THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake",
}


class GpuProbe:
    """Reads every GPU of this machine; ``available`` is False where NVML cannot start."""

    def __init__(self) -> None:
        self.available = False
        self.why_not = ""
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
            self.available = True
        except Exception as exc:  # no library, no driver, no device: a CPU node
            self.why_not = f"NVML unavailable: {exc}"

    def sample(
        self, trial_of: Callable[[int], int | None] = lambda pid: None
    ) -> tuple[GpuSample, ...]:
        """Every GPU now; ``trial_of`` names the trial of a process id, for the GPU's users."""
        if not self.available:
            return ()
        nv = self._nvml
        out = []
        for index, handle in enumerate(self._handles):
            memory = nv.nvmlDeviceGetMemoryInfo(handle)
            reasons = _optional(nv.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
            power_mw = _optional(nv.nvmlDeviceGetPowerUsage, handle)
            clock = _optional(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM)
            ecc = _optional(
                nv.nvmlDeviceGetTotalEccErrors,
                handle,
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nv.NVML_VOLATILE_ECC,
            )
            procs = _optional(nv.nvmlDeviceGetComputeRunningProcesses, handle) or []
            trials = {t for p in procs if (t := trial_of(p.pid)) is not None}
            out.append(
                GpuSample(
                    trial_ids=tuple(sorted(trials)),
                    index=index,
                    uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                    utilization_pct=float(nv.nvmlDeviceGetUtilizationRates(handle).gpu),
                    memory_used_gb=memory.used / _GB,
                    memory_total_gb=memory.total / _GB,
                    temperature_c=float(
                        nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)
                    ),
                    power_w=power_mw / 1000.0 if power_mw is not None else None,
                    sm_clock_mhz=float(clock) if clock is not None else None,
                    ecc_uncorrected=int(ecc or 0),
                    throttle_reasons=tuple(
                        name for bit, name in _THROTTLE_BITS.items() if int(reasons or 0) & bit
                    ),
                )
            )
        return tuple(out)

    def inventory(self) -> tuple[dict[str, str], ...]:
        if not self.available:
            return ()
        nv = self._nvml
        driver = _text(nv.nvmlSystemGetDriverVersion())
        return tuple(
            {
                "model": _text(nv.nvmlDeviceGetName(h)),
                "memory_gb": f"{nv.nvmlDeviceGetMemoryInfo(h).total / _GB:.1f}",
                "driver": driver,
                "uuid": _text(nv.nvmlDeviceGetUUID(h)),
            }
            for h in self._handles
        )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _optional(read: Callable[..., Any], *args: Any) -> Any:
    """A reading some GPUs do not support (ECC on consumer boards, power on some) is None."""
    try:
        return read(*args)
    except Exception:
        return None
