"""Predicting rows without the catalog values that were derived from them.

Some datasheet efficiencies in the catalog come from development rows: a whole-network training
rate divided by the device's peak (``hardware_models/devices/*.toml``: the entry's
``derived_from`` lists the rows, any one of which gives the value; docs/hardware.md, "How the
default efficiencies were derived"). A validation that predicts such a row with such a value
predicts it partly from itself. So every validation split (leave-one-source-out, a held-out file,
the scale-extrapolation benchmark, the large-model rows) predicts its rows with a catalog in which
each value whose ``derived_from`` rows it predicts, all of them, is replaced by what the catalog
gives without them (``unseen_devices``):

* a value another published run also bounds (the entry's ``alternatives``: value, rows, source):
  the highest such value whose rows are not all predicted;
* else a device's ``compute_efficiency``: the median of the values that stand on the devices of its
  architecture generation (``hardware_models.compute.architecture``); with none, of the nearest
  generation of the same kind that has one (the earlier of two equally near); with none, of its
  kind; with none, of every device. Placeholders (a source starting "placeholder") are not counted.
* else a layer type's efficiency (``[layer_efficiency.transformer]``): the device's compute
  efficiency (itself replaced if its rows are predicted too).

The replacements reach the model as a profile's ``DeviceFit`` (``Profile.devices``), which both
the compute fit and every prediction read (``Profile.device``); a fitted efficiency already in the
profile is kept. A row's note names what was replaced (``unseen_note``).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Collection

from ddlsim.hardware_models.catalog import Device, device_names, load_device
from ddlsim.hardware_models.compute import ARCHITECTURES, architecture
from ddlsim.hardware_models.profile import DeviceFit, Profile

COMPUTE = "compute_efficiency"
GENERATIONS = tuple(name for name, _ in ARCHITECTURES)


def unseen(device: Device, field: str, predicted: Collection[str]) -> bool:
    """Whether ``device``'s ``field`` was derived from rows all of which are in ``predicted``."""
    derivation = device.derived_from.get(field)
    return derivation is not None and all(row in predicted for row in derivation.rows)


def _alternative(device: Device, field: str, predicted: Collection[str]) -> tuple[float, str] | None:
    """The highest value another published run gives ``field`` (they are lower bounds) among the
    alternatives whose rows are not all predicted, and where from; None without one."""
    standing = [(value, rows, source) for value, rows, source in device.derived_from[field].alternatives
                if not all(row in predicted for row in rows)]  # fmt: skip
    if not standing:
        return None
    value, rows, _ = max(standing)
    return value, f"the bound {', '.join(rows)} gives"


def _standing(devices: list[Device], predicted: Collection[str]) -> list[Device]:
    return [
        device
        for device in devices
        if not unseen(device, COMPUTE, predicted)
        and not device.sources.get(COMPUTE, "").lower().startswith("placeholder")
    ]


def _replacement(device: Device, catalog: list[Device], predicted: Collection[str]) -> tuple[float, str]:
    """(compute efficiency, where from) for ``device`` without the rows in ``predicted``."""
    kin = _standing([other for other in catalog if other.kind == device.kind], predicted)
    generation = architecture(device)
    same = [other for other in kin if architecture(other) == generation]
    if not same and generation in GENERATIONS:
        here = GENERATIONS.index(generation)
        known = {architecture(other) for other in kin}
        nearest = sorted((abs(GENERATIONS.index(name) - here), GENERATIONS.index(name), name)
                         for name in known if name in GENERATIONS)  # fmt: skip
        if nearest:
            same = [other for other in kin if architecture(other) == nearest[0][2]]
    pool = same or kin or _standing(catalog, predicted)
    if not pool:
        return device.compute_efficiency, "kept: no device has a value that stands"
    value = statistics.median(other.compute_efficiency for other in pool)
    names = ", ".join(sorted(other.token for other in pool))
    return value, f"the median of {names}"


def unseen_devices(predicted: Collection[str]) -> dict[str, DeviceFit]:
    """A ``DeviceFit`` for every catalog device with a value derived only from rows in ``predicted``."""
    predicted = set(predicted)
    catalog = [load_device(name) for name in device_names()]
    fits: dict[str, DeviceFit] = {}
    for device in catalog:
        fields = [field for field in device.derived_from if unseen(device, field, predicted)]
        if not fields:
            continue
        compute = device.compute_efficiency
        sources: dict[str, str] = {}
        if COMPUTE in fields:
            compute, origin = _alternative(device, COMPUTE, predicted) or _replacement(device, catalog, predicted)
            sources[COMPUTE] = (
                f"unseen: compute efficiency {compute:.3g}, not the catalog's {device.compute_efficiency:g}, derived "
                f"from {', '.join(device.derived_from[COMPUTE].rows)}, which this validation predicts ({origin})"
            )
        layers = {}
        for field in fields:
            if field.startswith("layer_efficiency."):
                layer = field.partition(".")[2]
                value, origin = _alternative(device, field, predicted) or (compute, "the device's compute efficiency")
                layers[layer] = value
                rows = ", ".join(device.derived_from[field].rows)
                catalog_value = device.layer_efficiency[layer]
                sources[field] = (
                    f"unseen: {layer} layers' efficiency {value:.3g}, not the catalog's {catalog_value:g}, "
                    f"derived from {rows}, which this validation predicts ({origin})"
                )
        fits[device.token] = DeviceFit(
            compute_efficiency=compute if COMPUTE in fields else None, layer_efficiency=layers, sources=sources
        )
    return fits


def unseen_note(profile: Profile, device: str) -> str:
    """What ``profile`` replaced of ``device``'s catalog values (for a row's note), or ""."""
    fit = profile.devices.get(device)
    replaced = [text for text in (fit.sources.values() if fit else ()) if text.startswith("unseen: ")]
    return "; ".join(f"{device}: {text.removeprefix('unseen: ')}" for text in replaced)


def without(profile: Profile, predicted: Collection[str]) -> Profile:
    """``profile`` predicting ``predicted`` without the catalog values derived from them (a device's
    fitted efficiencies in ``profile`` are kept)."""
    devices = dict(profile.devices)
    for token, fit in unseen_devices(predicted).items():
        held = devices.get(token)
        if held is None:
            devices[token] = fit
            continue
        devices[token] = dataclasses.replace(
            held,
            compute_efficiency=held.compute_efficiency or fit.compute_efficiency,
            layer_efficiency={**fit.layer_efficiency, **held.layer_efficiency},
            sources={**fit.sources, **held.sources},
        )
    return dataclasses.replace(profile, devices=devices) if devices != profile.devices else profile
