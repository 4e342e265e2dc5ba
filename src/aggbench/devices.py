"""The one device check, shared by training (``device:`` in a cell config) and evaluation
(``--device``): a device this machine lacks is refused before anything loads, so a typo or a
missing GPU costs no model load and shows no torch traceback."""

from __future__ import annotations

from aggbench.errors import InputError


class DeviceError(InputError, ValueError):
    """A device string that is not a device, or a device this machine does not have."""


def check_device(device: str | None, what: str = "--device") -> None:
    """Raise :class:`DeviceError` unless ``device`` can be used here.

    ``device`` is ``None``/``auto`` (always fine: cuda when available, else cpu), ``cpu``,
    ``cuda``, ``cuda:N`` or ``mps``; ``what`` names the setting in the message (``"device"``,
    ``"--device"``).
    """
    if device in (None, "", "auto"):
        return
    import torch

    usable = "use cpu, cuda, cuda:N or auto (auto: cuda when available, else cpu)"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise DeviceError(f"{what}={device!r} is not a device; {usable}") from None
    if dev.type == "cpu":
        return
    if dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError(f"{what}={device!r} but MPS is not available on this machine; use cpu or auto")
        return
    if dev.type != "cuda":
        raise DeviceError(f"{what}={device!r}: aggbench runs on cpu, cuda or mps, not {dev.type!r}; {usable}")
    if not torch.cuda.is_available():
        raise DeviceError(
            f"{what}={device!r} but CUDA is not available on this machine "
            f"(torch {torch.__version__}); use cpu or auto"
        )
    n = torch.cuda.device_count()
    if dev.index is not None and dev.index >= n:
        raise DeviceError(
            f"{what}={device!r} but this machine has {n} CUDA device(s): cuda:0 .. cuda:{n - 1}; "
            "use one of them, or cuda"
        )
